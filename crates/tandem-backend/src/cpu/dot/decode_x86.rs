//! AVX2 decoders from ggml blocks to unsigned byte quants in element order (the form every x86
//! kernel multiplies), shared by the AVX2 and AVX-512 kernels (AVX2 functions inline into
//! AVX-512 ones). See `layout` for the meaning of the unsigned quants and offsets.

// Index loops over lanes and rows are deliberate: they mirror the vector lanes they fill.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::layout::{Legacy, Q2K, Q3K, Q4K, Q5K, Q6K};

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn load256(p: &[u8]) -> __m256i {
    assert!(p.len() >= 32);
    // SAFETY: 32 bytes are in bounds.
    unsafe { _mm256_loadu_si256(p.as_ptr() as *const __m256i) }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn load128(p: &[u8]) -> __m128i {
    assert!(p.len() >= 16);
    // SAFETY: 16 bytes are in bounds.
    unsafe { _mm_loadu_si128(p.as_ptr() as *const __m128i) }
}

#[inline]
fn u32_at(b: &[u8], off: usize) -> u32 {
    let v: &[u8; 4] = b[off..off + 4].try_into().unwrap();
    u32::from_le_bytes(*v)
}

/// 32 bytes, byte `i` = 0x10 where bit `i` of `bits` is set, else 0 (the 5th bit of a quant).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bits_to_0x10(bits: u32) -> __m256i {
    let v = _mm256_set1_epi32(bits as i32);
    // Byte i takes byte i / 8 of `bits`, then tests bit i % 8.
    let spread = _mm256_shuffle_epi8(
        v,
        _mm256_setr_epi64x(0, 0x0101_0101_0101_0101, 0x0202_0202_0202_0202, 0x0303_0303_0303_0303),
    );
    let sel = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, sel), sel);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// The 32 unsigned quants of a legacy block (`layout::Legacy::unpack`, vectorised).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn legacy_q<T: Legacy>(blk: &[u8]) -> __m256i {
    assert!(blk.len() >= T::BYTES);
    if T::BYTE_QUANTS {
        return _mm256_xor_si256(load256(&blk[T::QS_AT..]), _mm256_set1_epi8(-128));
    }
    let x = load128(&blk[T::QS_AT..]);
    let m = _mm_set1_epi8(0xF);
    let q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16::<4>(x), m), _mm_and_si128(x, m));
    match T::QH_AT {
        Some(o) => _mm256_or_si256(q, bits_to_0x10(u32_at(blk, o))),
        None => q,
    }
}

/// The scales of a K-quant super-block: 16 sub-block (16 elements each) scales and mins as
/// i16, and the f16 super-block scales as f32.
#[derive(Clone, Copy)]
pub(crate) struct KScales {
    pub scales: __m256i,
    pub mins: __m256i,
    pub d: f32,
    pub dmin: f32,
}

/// Per-type super-block decoder: quants as 8 chunks of 32 (AVX2) or 4 chunks of 64 (AVX-512)
/// unsigned bytes in element order, and the scales.
pub(crate) trait KDecode: super::layout::KQuant {
    /// # Safety (all methods)
    /// The CPU must support the features named by the function (AVX2/FMA/F16C, or AVX-512 BW
    /// for `quants512`); `b` must hold at least `BYTES` bytes.
    unsafe fn scales(b: &[u8]) -> KScales;
    unsafe fn quants(b: &[u8]) -> [__m256i; 8];
    unsafe fn quants512(b: &[u8]) -> [__m512i; 4];
}

/// The little-endian f16 at `b[off..]` as f32 (the `half` crate would check for F16C at run
/// time on every call). Needs `b[off..off + 4]`: a 4-byte load zero-fills the vector register,
/// whereas for a lone u16 LLVM emits an insert into whatever register is at hand, a false
/// dependency (seen: on a loop's scalar accumulator). Every block has 4 bytes from each scale.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn f16_at(b: &[u8], off: usize) -> f32 {
    let w: &[u8; 4] = b[off..off + 4].try_into().unwrap();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from_le_bytes(*w))))
}

/// As [`f16_at`] for a scale at the end of a block: reads `b[off - 2..off + 2]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn f16_end_at(b: &[u8], off: usize) -> f32 {
    let w: &[u8; 4] = b[off - 2..off + 2].try_into().unwrap();
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from_le_bytes(*w)));
    _mm_cvtss_f32(_mm_movehdup_ps(v))
}

/// Q4_K / Q5_K packed 6-bit scales and mins (ggml's kmask trick), each duplicated for the two
/// 16-element halves of a 32-element sub-block, as i16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn k4_scales_mins(s: &[u8]) -> (__m256i, __m256i) {
    const KMASK1: u32 = 0x3f3f_3f3f;
    const KMASK2: u32 = 0x0f0f_0f0f;
    const KMASK3: u32 = 0x0303_0303;
    let (u0, u1, u2) = (u32_at(s, 0), u32_at(s, 4), u32_at(s, 8));
    let sc = [u0 & KMASK1, (u2 & KMASK2) | (((u0 >> 6) & KMASK3) << 4)];
    let mn = [u1 & KMASK1, ((u2 >> 4) & KMASK2) | (((u1 >> 6) & KMASK3) << 4)];
    let widen = |w: [u32; 2]| {
        let v = _mm_set_epi32(0, 0, w[1] as i32, w[0] as i32);
        _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(v, v))
    };
    (widen(sc), widen(mn))
}

/// Q3_K's 16 scales (ggml's kmask1/kmask2 unpacking, minus the stored offset of 32) as i16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q3k_scales(s: &[u8]) -> __m256i {
    const KMASK1: u32 = 0x0303_0303;
    const KMASK2: u32 = 0x0f0f_0f0f;
    let (a0, a1, tmp) = (u32_at(s, 0), u32_at(s, 4), u32_at(s, 8));
    let aux = [
        (a0 & KMASK2) | ((tmp & KMASK1) << 4),
        (a1 & KMASK2) | (((tmp >> 2) & KMASK1) << 4),
        ((a0 >> 4) & KMASK2) | (((tmp >> 4) & KMASK1) << 4),
        ((a1 >> 4) & KMASK2) | (((tmp >> 6) & KMASK1) << 4),
    ];
    let v = _mm_setr_epi32(aux[0] as i32, aux[1] as i32, aux[2] as i32, aux[3] as i32);
    _mm256_sub_epi16(_mm256_cvtepu8_epi16(v), _mm256_set1_epi16(32))
}

/// 64 bytes holding the 32 bytes at `p` twice, shifted right (per 16-bit lane, then masked per
/// byte) by `lo` in the low half and `hi` in the high half.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
fn split512(p: &[u8], lo: u64, hi: u64, mask: i8) -> __m512i {
    let v = _mm512_broadcast_i64x4(load256(p));
    let sh = _mm512_setr_epi64(
        lo as i64 * 0x0001_0001_0001_0001,
        lo as i64 * 0x0001_0001_0001_0001,
        lo as i64 * 0x0001_0001_0001_0001,
        lo as i64 * 0x0001_0001_0001_0001,
        hi as i64 * 0x0001_0001_0001_0001,
        hi as i64 * 0x0001_0001_0001_0001,
        hi as i64 * 0x0001_0001_0001_0001,
        hi as i64 * 0x0001_0001_0001_0001,
    );
    _mm512_and_si512(_mm512_srlv_epi16(v, sh), _mm512_set1_epi8(mask))
}

/// Mask of the bytes of `[x | x]` (x = the 32 bytes at `p`) whose bit `lo` (low half) or bit
/// `hi` (high half) is set.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
fn bits512(p: &[u8], lo: u32, hi: u32) -> __mmask64 {
    let v = _mm512_broadcast_i64x4(load256(p));
    let m = _mm512_inserti64x4::<1>(_mm512_set1_epi8((1u8 << lo) as i8), _mm256_set1_epi8((1u8 << hi) as i8));
    _mm512_test_epi8_mask(v, m)
}

impl KDecode for Q4K {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(b: &[u8]) -> KScales {
        let (scales, mins) = k4_scales_mins(&b[4..16]);
        KScales {
            scales,
            mins,
            d: f16_at(b, 0),
            dmin: f16_at(b, 2),
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn quants(b: &[u8]) -> [__m256i; 8] {
        let m = _mm256_set1_epi8(0xF);
        let mut q = [_mm256_setzero_si256(); 8];
        for c in 0..4 {
            let x = load256(&b[16 + 32 * c..]);
            q[2 * c] = _mm256_and_si256(x, m);
            q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(x), m);
        }
        q
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
    unsafe fn quants512(b: &[u8]) -> [__m512i; 4] {
        let mut q = [_mm512_setzero_si512(); 4];
        for (c, q) in q.iter_mut().enumerate() {
            // Low nibbles are elements 64c..64c + 32, high nibbles the next 32.
            *q = split512(&b[16 + 32 * c..], 0, 4, 0xF);
        }
        q
    }
}

impl KDecode for Q5K {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(b: &[u8]) -> KScales {
        unsafe { Q4K::scales(b) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn quants(b: &[u8]) -> [__m256i; 8] {
        let m = _mm256_set1_epi8(0xF);
        let one = _mm256_set1_epi8(1);
        let qh = load256(&b[16..]);
        let mut q = [_mm256_setzero_si256(); 8];
        for c in 0..4 {
            let x = load256(&b[48 + 32 * c..]);
            // Bit 2c (low nibbles) and 2c + 1 (high nibbles) of qh[l] are the 5th bits.
            let h0 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c as i32)), one);
            let h1 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c as i32 + 1)), one);
            q[2 * c] = _mm256_or_si256(_mm256_and_si256(x, m), _mm256_slli_epi16::<4>(h0));
            q[2 * c + 1] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(x), m),
                _mm256_slli_epi16::<4>(h1),
            );
        }
        q
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
    unsafe fn quants512(b: &[u8]) -> [__m512i; 4] {
        let mut q = [_mm512_setzero_si512(); 4];
        for (c, q) in q.iter_mut().enumerate() {
            let lo4 = split512(&b[48 + 32 * c..], 0, 4, 0xF);
            let h = bits512(&b[16..], 2 * c as u32, 2 * c as u32 + 1);
            *q = _mm512_mask_add_epi8(lo4, h, lo4, _mm512_set1_epi8(0x10));
        }
        q
    }
}

impl KDecode for Q6K {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(b: &[u8]) -> KScales {
        let scales = _mm256_cvtepi8_epi16(load128(&b[192..]));
        KScales {
            scales,
            mins: _mm256_setzero_si256(),
            d: f16_end_at(b, 208),
            dmin: 0.0,
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn quants(b: &[u8]) -> [__m256i; 8] {
        let m4 = _mm256_set1_epi8(0xF);
        let m2 = _mm256_set1_epi8(3);
        let mut q = [_mm256_setzero_si256(); 8];
        for h in 0..2 {
            let l0 = load256(&b[64 * h..]);
            let l1 = load256(&b[64 * h + 32..]);
            let hb = load256(&b[128 + 32 * h..]);
            let hi = |v: __m256i| _mm256_slli_epi16::<4>(_mm256_and_si256(v, m2));
            q[4 * h] = _mm256_or_si256(_mm256_and_si256(l0, m4), hi(hb));
            q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, m4), hi(_mm256_srli_epi16::<2>(hb)));
            q[4 * h + 2] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(l0), m4),
                hi(_mm256_srli_epi16::<4>(hb)),
            );
            q[4 * h + 3] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(l1), m4),
                hi(_mm256_srli_epi16::<6>(hb)),
            );
        }
        q
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
    unsafe fn quants512(b: &[u8]) -> [__m512i; 4] {
        let mut q = [_mm512_setzero_si512(); 4];
        for h in 0..2 {
            // SAFETY: 64 bytes of ql.
            let l = unsafe { _mm512_loadu_si512(b[64 * h..64 * h + 64].as_ptr() as *const _) };
            let m4 = _mm512_set1_epi8(0xF);
            // [ql[l] | ql[l + 32]] low nibbles with qh bits (0,1 | 2,3); high nibbles with (4,5 | 6,7).
            let h01 = _mm512_slli_epi16::<4>(split512(&b[128 + 32 * h..], 0, 2, 3));
            let h23 = _mm512_slli_epi16::<4>(split512(&b[128 + 32 * h..], 4, 6, 3));
            q[2 * h] = _mm512_or_si512(_mm512_and_si512(l, m4), h01);
            q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16::<4>(l), m4), h23);
        }
        q
    }
}

/// The 2-bit fields of one 32-byte half of a Q2_K / Q3_K block: field `k` of byte `l` is element
/// `32k + l` of the half.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn two_bit_fields(x: __m256i) -> [__m256i; 4] {
    let m = _mm256_set1_epi8(3);
    [
        _mm256_and_si256(x, m),
        _mm256_and_si256(_mm256_srli_epi16::<2>(x), m),
        _mm256_and_si256(_mm256_srli_epi16::<4>(x), m),
        _mm256_and_si256(_mm256_srli_epi16::<6>(x), m),
    ]
}

impl KDecode for Q3K {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(b: &[u8]) -> KScales {
        KScales {
            scales: q3k_scales(&b[96..108]),
            mins: _mm256_setzero_si256(),
            d: f16_end_at(b, 108),
            dmin: 0.0,
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn quants(b: &[u8]) -> [__m256i; 8] {
        let hm = load256(b);
        let one = _mm256_set1_epi8(1);
        let mut q = [_mm256_setzero_si256(); 8];
        for h in 0..2 {
            let low = two_bit_fields(load256(&b[32 + 32 * h..]));
            for k in 0..4 {
                // Bit 4h + k of hmask[l] is the high bit (set means "no -4"): q' = low + 4·bit.
                let bit = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128((4 * h + k) as i32)), one);
                q[4 * h + k] = _mm256_or_si256(low[k], _mm256_slli_epi16::<2>(bit));
            }
        }
        q
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
    unsafe fn quants512(b: &[u8]) -> [__m512i; 4] {
        let mut q = [_mm512_setzero_si512(); 4];
        for h in 0..2 {
            for j in 0..2 {
                let (k0, k1) = (2 * j as u32, 2 * j as u32 + 1);
                let low = split512(&b[32 + 32 * h..], 2 * k0 as u64, 2 * k1 as u64, 3);
                let hb = bits512(b, 4 * h as u32 + k0, 4 * h as u32 + k1);
                q[2 * h + j] = _mm512_mask_add_epi8(low, hb, low, _mm512_set1_epi8(4));
            }
        }
        q
    }
}

impl KDecode for Q2K {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(b: &[u8]) -> KScales {
        let s = load128(b);
        let scales = _mm256_cvtepu8_epi16(_mm_and_si128(s, _mm_set1_epi8(0xF)));
        let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(s), _mm_set1_epi8(0xF)));
        KScales {
            scales,
            mins,
            d: f16_at(b, 80),
            dmin: f16_end_at(b, 82),
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn quants(b: &[u8]) -> [__m256i; 8] {
        let mut q = [_mm256_setzero_si256(); 8];
        for h in 0..2 {
            let f = two_bit_fields(load256(&b[16 + 32 * h..]));
            q[4 * h..4 * h + 4].copy_from_slice(&f);
        }
        q
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
    unsafe fn quants512(b: &[u8]) -> [__m512i; 4] {
        let mut q = [_mm512_setzero_si512(); 4];
        for h in 0..2 {
            q[2 * h] = split512(&b[16 + 32 * h..], 0, 2, 3);
            q[2 * h + 1] = split512(&b[16 + 32 * h..], 4, 6, 3);
        }
        q
    }
}
