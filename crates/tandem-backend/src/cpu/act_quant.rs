//! Quantization of f32 activation rows before integer dot products, as llama.cpp's CPU backend
//! does it: 32-element Q8 blocks for the legacy weight types (Q4_0 … Q8_0) and 256-element Q8_K
//! blocks for the K-quants.
//!
//! The values are exactly those llama.cpp's x86 CPU backend computes, since its outputs are the parity
//! reference: 32-element blocks as its `quantize_row_q8_0`/`_q8_1` (`round_half_even(x * 127 / amax)`,
//! scale `d = amax / 127` stored as f16, and Q8_1's `s = d * sum` stored as f16), Q8_K blocks as
//! `quantize_row_q8_K_ref` (`nearest_int(x * -127 / max)`, f32 scale). The layout is
//! structure-of-arrays per row so SIMD kernels load the quants of a block with one aligned load; the
//! f16 scales are kept as the f32 values they convert to. Per block we also keep the sum of the quants
//! (`sum`, for the offset of unsigned weight nibbles).
//!
//! Every SIMD routine here produces bit-identical output to the scalar one; blocks holding a
//! non-finite value, or whose scale overflows, take the scalar path.

use super::isa::Isa;
use super::pool::{SendPtr, ThreadPool};

/// Elements per Q8 (legacy) activation block.
pub const Q8_BLOCK: usize = 32;
/// Elements per Q8_K activation block.
pub const Q8K_BLOCK: usize = 256;

/// One activation row quantized in 32-element blocks: `x[i] ≈ d[i / 32] * qs[i]`.
#[derive(Clone, Copy, Debug)]
pub struct Q8Row<'a> {
    pub qs: &'a [i8],
    pub d: &'a [f32],
    /// Sum of the 32 quants of each block.
    pub sum: &'a [i32],
    /// `d * sum` per block.
    pub s: &'a [f32],
}

/// One activation row quantized in 256-element blocks: `x[i] ≈ d[i / 256] * qs[i]`.
#[derive(Clone, Copy, Debug)]
pub struct Q8KRow<'a> {
    pub qs: &'a [i8],
    pub d: &'a [f32],
    /// Sum of each 16 consecutive quants.
    pub bsums: &'a [i16],
}

/// Which activation format a weight type's dot product consumes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActFormat {
    /// 32-element blocks (Q8_0 with Q8_1's sum): for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 weights.
    Q8,
    /// 256-element Q8_K blocks: for Q2_K … Q6_K weights.
    Q8K,
}

impl ActFormat {
    /// Elements per block.
    pub fn block(self) -> usize {
        match self {
            ActFormat::Q8 => Q8_BLOCK,
            ActFormat::Q8K => Q8K_BLOCK,
        }
    }
}

/// Owned quantized activations: `rows` rows of `cols` elements, in one of the two formats.
/// Buffers only grow, so a long-lived value does not allocate in steady state.
#[derive(Default)]
pub struct QuantizedActs {
    format: Option<ActFormat>,
    cols: usize,
    rows: usize,
    qs: AVec<i8>,
    d: AVec<f32>,
    sum: AVec<i32>,
    s: AVec<f32>,
    bsums: AVec<i16>,
}

impl QuantizedActs {
    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Sizes the buffers for `rows` rows of `cols` elements in 32-element blocks.
    fn reset_q8(&mut self, rows: usize, cols: usize) {
        assert!(
            cols.is_multiple_of(Q8_BLOCK),
            "Q8 activations need whole 32-element blocks"
        );
        let nb = rows * (cols / Q8_BLOCK);
        self.cols = cols;
        self.rows = rows;
        self.qs.resize(rows * cols);
        self.d.resize(nb);
        self.sum.resize(nb);
        self.s.resize(nb);
    }

    /// Sizes the buffers for `rows` rows of `cols` elements in 256-element blocks.
    fn reset_q8k(&mut self, rows: usize, cols: usize) {
        assert!(
            cols.is_multiple_of(Q8K_BLOCK),
            "Q8_K activations need whole 256-element blocks"
        );
        let nb = rows * (cols / Q8K_BLOCK);
        self.cols = cols;
        self.rows = rows;
        self.qs.resize(rows * cols);
        self.d.resize(nb);
        self.bsums.resize(nb * 16);
    }

    /// The format of the last [`Self::quantize`], if any.
    pub fn format(&self) -> Option<ActFormat> {
        self.format
    }

    /// Quantizes `rows` rows of `x` (row-major, `cols` each) in `format`, in parallel on `pool`
    /// (with `isa`, or scalar code if the CPU lacks it; the bytes are the same either way).
    ///
    /// # Panics
    /// If `x.len() != rows * cols` or `cols` is not a whole number of the format's blocks.
    pub fn quantize(&mut self, pool: &ThreadPool, isa: Isa, format: ActFormat, x: &[f32], rows: usize, cols: usize) {
        assert_eq!(x.len(), rows * cols);
        match format {
            ActFormat::Q8 => self.reset_q8(rows, cols),
            ActFormat::Q8K => self.reset_q8k(rows, cols),
        }
        self.format = Some(format);
        let nb = cols / format.block();
        let (qs, d) = (
            SendPtr(self.qs.as_mut_slice().as_mut_ptr()),
            SendPtr(self.d.as_mut_slice().as_mut_ptr()),
        );
        let (sum, s) = (
            SendPtr(self.sum.as_mut_slice().as_mut_ptr()),
            SendPtr(self.s.as_mut_slice().as_mut_ptr()),
        );
        let bsums = SendPtr(self.bsums.as_mut_slice().as_mut_ptr());
        // About 64 KiB of input per task: big enough to amortise a task, small enough to balance.
        let per_task = (16384 / cols.max(1)).clamp(1, rows.max(1));
        pool.run(rows.div_ceil(per_task), &|task| {
            for r in task * per_task..((task + 1) * per_task).min(rows) {
                let x = &x[r * cols..][..cols];
                // SAFETY: the pointers come from `&mut self` buffers sized above, and each row's
                // ranges are written by exactly one task.
                unsafe {
                    match format {
                        ActFormat::Q8 => quantize_row_q8(
                            isa,
                            x,
                            qs.slice(r * cols, cols),
                            d.slice(r * nb, nb),
                            sum.slice(r * nb, nb),
                            s.slice(r * nb, nb),
                        ),
                        ActFormat::Q8K => quantize_row_q8k(
                            isa,
                            x,
                            qs.slice(r * cols, cols),
                            d.slice(r * nb, nb),
                            bsums.slice(r * nb * 16, nb * 16),
                        ),
                    }
                }
            }
        });
    }

    /// Row `r`, quantized in the 32-element format.
    ///
    /// # Panics
    /// If the last `quantize` used another format, or `r >= rows`.
    pub fn q8_row(&self, r: usize) -> Q8Row<'_> {
        assert_eq!(self.format, Some(ActFormat::Q8), "activations are not in Q8 format");
        assert!(r < self.rows, "row {r} of {}", self.rows);
        let (k, nb) = (self.cols, self.cols / Q8_BLOCK);
        Q8Row {
            qs: &self.qs.as_slice()[r * k..][..k],
            d: &self.d.as_slice()[r * nb..][..nb],
            sum: &self.sum.as_slice()[r * nb..][..nb],
            s: &self.s.as_slice()[r * nb..][..nb],
        }
    }

    /// Row `r`, quantized in the Q8_K format.
    ///
    /// # Panics
    /// If the last `quantize` used another format, or `r >= rows`.
    pub fn q8k_row(&self, r: usize) -> Q8KRow<'_> {
        assert_eq!(self.format, Some(ActFormat::Q8K), "activations are not in Q8_K format");
        assert!(r < self.rows, "row {r} of {}", self.rows);
        let (k, nb) = (self.cols, self.cols / Q8K_BLOCK);
        Q8KRow {
            qs: &self.qs.as_slice()[r * k..][..k],
            d: &self.d.as_slice()[r * nb..][..nb],
            bsums: &self.bsums.as_slice()[r * nb * 16..][..nb * 16],
        }
    }
}

/// Quantizes one row into 32-element blocks (with `isa`, or scalar code if the CPU lacks it).
///
/// # Panics
/// Unless `x.len()` is a multiple of 32, `qs` has `x.len()` elements and the others one per block.
pub fn quantize_row_q8(isa: Isa, x: &[f32], qs: &mut [i8], d: &mut [f32], sum: &mut [i32], s: &mut [f32]) {
    let isa = isa.or_scalar();
    let nb = x.len() / Q8_BLOCK;
    assert!(x.len().is_multiple_of(Q8_BLOCK) && qs.len() == x.len());
    assert!(d.len() == nb && sum.len() == nb && s.len() == nb);
    for (i, (x, q)) in x.chunks_exact(Q8_BLOCK).zip(qs.chunks_exact_mut(Q8_BLOCK)).enumerate() {
        let x: &[f32; 32] = x.try_into().unwrap();
        let q: &mut [i8; 32] = q.try_into().unwrap();
        let (dd, ss) = match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `or_scalar` above checked that the CPU has this level.
            Isa::Avx512 => unsafe { x86::q8_block_avx512(x, q) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { x86::q8_block_avx2(x, q) },
            _ => q8_block_scalar(x, q),
        };
        // ggml stores both scales as f16: `d` of Q8_0/Q8_1 and Q8_1's `s = d * sum` (from the unrounded d).
        d[i] = f16_round(dd);
        sum[i] = ss;
        s[i] = f16_round(dd * ss as f32);
    }
}

fn f16_round(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

/// Quantizes one row into Q8_K blocks (with `isa`, or scalar code if the CPU lacks it).
///
/// # Panics
/// Unless `x.len()` is a multiple of 256, `qs` has `x.len()` elements, `d` one per block and
/// `bsums` sixteen per block.
pub fn quantize_row_q8k(isa: Isa, x: &[f32], qs: &mut [i8], d: &mut [f32], bsums: &mut [i16]) {
    let isa = isa.or_scalar();
    let nb = x.len() / Q8K_BLOCK;
    assert!(x.len().is_multiple_of(Q8K_BLOCK) && qs.len() == x.len());
    assert!(d.len() == nb && bsums.len() == nb * 16);
    let blocks = x.chunks_exact(Q8K_BLOCK).zip(qs.chunks_exact_mut(Q8K_BLOCK));
    for (i, ((x, q), bs)) in blocks.zip(bsums.chunks_exact_mut(16)).enumerate() {
        let x: &[f32; 256] = x.try_into().unwrap();
        let q: &mut [i8; 256] = q.try_into().unwrap();
        let bs: &mut [i16; 16] = bs.try_into().unwrap();
        d[i] = match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `or_scalar` above checked that the CPU has this level.
            Isa::Avx512 => unsafe { x86::q8k_block_avx512(x, q, bs) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { x86::q8k_block_avx2(x, q, bs) },
            _ => q8k_block_scalar(x, q, bs),
        };
    }
}

/// One block as llama.cpp's x86 CPU backend quantizes activations (`quantize_row_q8_0`/`_q8_1`, not the
/// `_ref` versions): `q = round_half_even(x * (127 / amax))`. Returns `(d, sum of quants)` with the
/// unrounded `d = amax / 127`; `quantize_row_q8` rounds the stored scales to f16 as ggml's blocks do.
pub fn q8_block_scalar(x: &[f32; 32], q: &mut [i8; 32]) -> (f32, i32) {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0i32;
    for (q, &v) in q.iter_mut().zip(x) {
        *q = (v * id).round_ties_even() as i8;
        sum += *q as i32;
    }
    (d, sum)
}

/// ggml's `quantize_row_q8_K_ref` for one block (bsums filled), returning `d`.
pub fn q8k_block_scalar(x: &[f32; 256], q: &mut [i8; 256], bsums: &mut [i16; 16]) -> f32 {
    // The value of largest magnitude, first one on ties (its sign sets the sign of d).
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if max == 0.0 {
        q.fill(0);
        bsums.fill(0);
        return 0.0;
    }
    let iscale = -127.0 / max;
    for (q, &v) in q.iter_mut().zip(x) {
        *q = ((iscale * v).round_ties_even() as i32).clamp(-128, 127) as i8;
    }
    for (b, q) in bsums.iter_mut().zip(q.chunks_exact(16)) {
        *b = q.iter().map(|&v| v as i16).sum();
    }
    1.0 / iscale
}

#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::dot::avx2::hsum_i32;
    use super::{q8_block_scalar, q8k_block_scalar};

    /// Horizontal max of 8 lanes (order-independent: max is exact).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn hmax_avx2(v: __m256) -> f32 {
        let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let m = _mm_max_ss(m, _mm_movehdup_ps(m));
        _mm_cvtss_f32(m)
    }

    /// Packs 32 i32 (four vectors in element order) into 32 saturated i8 in element order.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn pack_i8_avx2(a: __m256i, b: __m256i, c: __m256i, d: __m256i) -> __m256i {
        // packs works per 128-bit lane; the final permute restores element order.
        let ab = _mm256_packs_epi32(a, b);
        let cd = _mm256_packs_epi32(c, d);
        let p = _mm256_packs_epi16(ab, cd);
        _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn q8_block_avx2(x: &[f32; 32], q: &mut [i8; 32]) -> (f32, i32) {
        let p = x.as_ptr();
        // SAFETY: 32 floats are in bounds.
        let v: [__m256; 4] = std::array::from_fn(|i| unsafe { _mm256_loadu_ps(p.add(8 * i)) });
        let absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        let a: [__m256; 4] = std::array::from_fn(|i| _mm256_and_ps(v[i], absmask));
        // Non-finite input: let the scalar code define the (degenerate) result.
        let big = _mm256_set1_ps(f32::MAX);
        let fin = (0..4).all(|i| _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_LE_OQ>(a[i], big)) == 0xff);
        let amax = hmax_avx2(_mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3])));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        if !fin || !id.is_finite() {
            return q8_block_scalar(x, q);
        }
        let idv = _mm256_set1_ps(id);
        // cvtps rounds to nearest even under the default MXCSR, like `round_ties_even`.
        let r: [__m256i; 4] = std::array::from_fn(|i| _mm256_cvtps_epi32(_mm256_mul_ps(v[i], idv)));
        let packed = pack_i8_avx2(r[0], r[1], r[2], r[3]);
        // SAFETY: 32 bytes are in bounds.
        unsafe { _mm256_storeu_si256(q.as_mut_ptr() as *mut __m256i, packed) };
        let s = _mm256_add_epi32(_mm256_add_epi32(r[0], r[1]), _mm256_add_epi32(r[2], r[3]));
        (d, hsum_i32(s))
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
    pub(super) fn q8_block_avx512(x: &[f32; 32], q: &mut [i8; 32]) -> (f32, i32) {
        let p = x.as_ptr();
        // SAFETY: 32 floats are in bounds.
        let (v0, v1) = unsafe { (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16))) };
        let (a0, a1) = (_mm512_abs_ps(v0), _mm512_abs_ps(v1));
        let big = _mm512_set1_ps(f32::MAX);
        let fin = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(a0, big) & _mm512_cmp_ps_mask::<_CMP_LE_OQ>(a1, big);
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        if fin != 0xffff || !id.is_finite() {
            return q8_block_scalar(x, q);
        }
        let idv = _mm512_set1_ps(id);
        let r0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, idv));
        let r1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, idv));
        let dst = q.as_mut_ptr();
        // SAFETY: 2 x 16 bytes are in bounds. Values are in -127..=127, so the narrowing is exact.
        unsafe {
            _mm_storeu_si128(dst as *mut __m128i, _mm512_cvtsepi32_epi8(r0));
            _mm_storeu_si128(dst.add(16) as *mut __m128i, _mm512_cvtsepi32_epi8(r1));
        }
        (d, _mm512_reduce_add_epi32(_mm512_add_epi32(r0, r1)))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn q8k_block_avx2(x: &[f32; 256], q: &mut [i8; 256], bsums: &mut [i16; 16]) -> f32 {
        let p = x.as_ptr();
        let absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        let big = _mm256_set1_ps(f32::MAX);
        let (mut m, mut fin) = (_mm256_setzero_ps(), 0xffi32);
        for i in 0..32 {
            // SAFETY: 256 floats are in bounds.
            let a = _mm256_and_ps(unsafe { _mm256_loadu_ps(p.add(8 * i)) }, absmask);
            fin &= _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_LE_OQ>(a, big));
            m = _mm256_max_ps(m, a);
        }
        let amax = hmax_avx2(m);
        if fin != 0xff || amax == 0.0 {
            return q8k_block_scalar(x, q, bsums);
        }
        // The first element of largest magnitude gives the sign, as in the scalar code.
        let max = x.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
        let iscale = -127.0 / max;
        if !iscale.is_finite() {
            return q8k_block_scalar(x, q, bsums);
        }
        let sv = _mm256_set1_ps(iscale);
        for g in 0..8 {
            // cvtps rounds to nearest even under the default MXCSR, like `round_ties_even`.
            // SAFETY: 256 floats / bytes are in bounds.
            let r: [__m256i; 4] = std::array::from_fn(|i| unsafe {
                _mm256_cvtps_epi32(_mm256_mul_ps(sv, _mm256_loadu_ps(p.add(32 * g + 8 * i))))
            });
            let packed = pack_i8_avx2(r[0], r[1], r[2], r[3]);
            unsafe { _mm256_storeu_si256(q.as_mut_ptr().add(32 * g) as *mut __m256i, packed) };
            let s0 = _mm256_add_epi32(r[0], r[1]);
            let s1 = _mm256_add_epi32(r[2], r[3]);
            bsums[2 * g] = hsum_i32(s0) as i16;
            bsums[2 * g + 1] = hsum_i32(s1) as i16;
        }
        1.0 / iscale
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
    pub(super) fn q8k_block_avx512(x: &[f32; 256], q: &mut [i8; 256], bsums: &mut [i16; 16]) -> f32 {
        let p = x.as_ptr();
        let big = _mm512_set1_ps(f32::MAX);
        let (mut m, mut fin) = (_mm512_setzero_ps(), 0xffffu16);
        for i in 0..16 {
            // SAFETY: 256 floats are in bounds.
            let a = _mm512_abs_ps(unsafe { _mm512_loadu_ps(p.add(16 * i)) });
            fin &= _mm512_cmp_ps_mask::<_CMP_LE_OQ>(a, big);
            m = _mm512_max_ps(m, a);
        }
        let amax = _mm512_reduce_max_ps(m);
        if fin != 0xffff || amax == 0.0 {
            return q8k_block_scalar(x, q, bsums);
        }
        let max = x.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
        let iscale = -127.0 / max;
        if !iscale.is_finite() {
            return q8k_block_scalar(x, q, bsums);
        }
        let sv = _mm512_set1_ps(iscale);
        for i in 0..16 {
            // SAFETY: 256 floats / bytes are in bounds.
            let r = _mm512_cvtps_epi32(_mm512_mul_ps(sv, unsafe { _mm512_loadu_ps(p.add(16 * i)) }));
            unsafe { _mm_storeu_si128(q.as_mut_ptr().add(16 * i) as *mut __m128i, _mm512_cvtsepi32_epi8(r)) };
            bsums[i] = _mm512_reduce_add_epi32(r) as i16;
        }
        1.0 / iscale
    }
}

/// A growable buffer of plain-old-data aligned to 64 bytes (a cache line, one zmm register).
pub(crate) struct AVec<T: Pod> {
    buf: Vec<Align64>,
    len: usize,
    _t: std::marker::PhantomData<T>,
}

/// Types valid for any bit pattern, so an `AVec` may hand out views of uninitialised-by-us bytes.
pub(crate) trait Pod: Copy + Default {}
impl Pod for u8 {}
impl Pod for i8 {}
impl Pod for i16 {}
impl Pod for i32 {}
impl Pod for f32 {}

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Align64([u8; 64]);

impl Default for Align64 {
    fn default() -> Self {
        Align64([0; 64])
    }
}

impl<T: Pod> Default for AVec<T> {
    fn default() -> Self {
        AVec {
            buf: Vec::new(),
            len: 0,
            _t: std::marker::PhantomData,
        }
    }
}

impl<T: Pod> AVec<T> {
    /// Sets the length to `len` elements. Contents are unspecified (zero when newly allocated);
    /// callers overwrite what they read.
    pub(crate) fn resize(&mut self, len: usize) {
        const { assert!(std::mem::align_of::<T>() <= 64) };
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .expect("buffer size overflows");
        let chunks = bytes.div_ceil(64);
        if self.buf.len() < chunks {
            self.buf.resize(chunks, Align64::default());
        }
        self.len = len;
    }

    pub(crate) fn as_slice(&self) -> &[T] {
        // SAFETY: the buffer holds at least `len` elements' bytes, is suitably aligned, and `T`
        // is plain old data (all types used are integers and floats, valid for any bit pattern).
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr() as *const T, self.len) }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as in `as_slice`, and `&mut self` gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.buf.as_mut_ptr() as *mut T, self.len) }
    }
}
