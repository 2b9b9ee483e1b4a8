//! Portable descriptions of the weight block layouts, shared by all ISA levels.
//!
//! Every quantized type is seen the same way by the kernels: unsigned quants `q` (elements in
//! ggml order), a constant `OFFSET` so that the value is `(q - OFFSET)` times the block or
//! sub-block scale, and for types with a min an extra subtracted term. The K-quant `unpack`
//! functions are the plain reading of ggml's dequantizers (the scalar kernels use them; the dot
//! tests check every kernel against tandem-quant's dequantizers).

/// The little-endian f16 at `b[off..]` as f32. Portable and exact for every f16 (subnormals
/// included; Giesen's `half_to_float_fast5`), without the `half` crate's per-call run-time CPU
/// check.
#[inline]
pub(crate) fn f16_at(b: &[u8], off: usize) -> f32 {
    let h = u16::from_le_bytes([b[off], b[off + 1]]);
    let mag = f32::from_bits(((h & 0x7fff) as u32) << 13) * f32::from_bits(0x7780_0000); // · 2^112
    let mut bits = mag.to_bits();
    if mag >= 65536.0 {
        bits |= 0xff << 23; // Inf / NaN
    }
    f32::from_bits(bits | (((h & 0x8000) as u32) << 16))
}

/// A legacy 32-element block type: `value = d·(q - OFFSET)`, plus `m` when `HAS_MIN`.
/// Layout: `f16 d` at 0, `f16 m` at 2 when `HAS_MIN`, then `QH_AT` (the 5th bits, if any) and
/// `QS_AT` (nibbles, or bytes for Q8_0).
pub(crate) trait Legacy {
    const BYTES: usize;
    const OFFSET: u32;
    /// log2(OFFSET), for the shift that scales activation sums.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    const SHIFT: u32;
    const HAS_MIN: bool;
    /// Byte offset of the 32-bit high-bit mask, for 5-bit types.
    const QH_AT: Option<usize>;
    const QS_AT: usize;
    /// 8-bit quants (Q8_0): stored as i8, seen as `q ^ 0x80`.
    const BYTE_QUANTS: bool = false;
}

macro_rules! legacy {
    ($name:ident, $bytes:expr, $off:expr, $shift:expr, $min:expr, $qh:expr, $qs:expr, $byte:expr) => {
        pub(crate) struct $name;
        impl Legacy for $name {
            const BYTES: usize = $bytes;
            const OFFSET: u32 = $off;
            const SHIFT: u32 = $shift;
            const HAS_MIN: bool = $min;
            const QH_AT: Option<usize> = $qh;
            const QS_AT: usize = $qs;
            const BYTE_QUANTS: bool = $byte;
        }
    };
}

legacy!(Q4_0, 18, 8, 3, false, None, 2, false);
legacy!(Q4_1, 20, 0, 0, true, None, 4, false);
legacy!(Q5_0, 22, 16, 4, false, Some(2), 6, false);
legacy!(Q5_1, 24, 0, 0, true, Some(4), 8, false);
legacy!(Q8_0, 34, 128, 7, false, None, 2, true);

/// A K-quant super-block (256 elements) seen as 16 sub-blocks of 16:
/// `value = d·scales[j]·(q - OFFSET) - dmin·mins[j]`.
pub(crate) struct KUnpacked {
    pub q: [u8; 256],
    pub scales: [i32; 16],
    pub mins: [i32; 16],
    pub d: f32,
    pub dmin: f32,
}

pub(crate) trait KQuant {
    const BYTES: usize;
    const OFFSET: u32;
    const HAS_MIN: bool;
    fn unpack(blk: &[u8]) -> KUnpacked;
}

/// ggml's `get_scale_min_k4` for all eight sub-blocks: (scales, mins).
pub(crate) fn scale_min_k4(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..4 {
        sc[j] = s[j] & 63;
        m[j] = s[j + 4] & 63;
        sc[j + 4] = (s[j + 8] & 0xF) | ((s[j] >> 6) << 4);
        m[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
    }
    (sc, m)
}

/// Q3_K's 16 six-bit scales (stored offset by 32), as ggml unpacks them with kmask1/kmask2.
pub(crate) fn q3k_scales(s: &[u8]) -> [i32; 16] {
    let mut out = [0i32; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let low = if j < 8 { s[j] & 0xF } else { s[j - 8] >> 4 };
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        *o = (low | (high << 4)) as i32 - 32;
    }
    out
}

pub(crate) struct Q2K;
pub(crate) struct Q3K;
pub(crate) struct Q4K;
pub(crate) struct Q5K;
pub(crate) struct Q6K;

impl KQuant for Q2K {
    const BYTES: usize = 84;
    const OFFSET: u32 = 0;
    const HAS_MIN: bool = true;
    fn unpack(b: &[u8]) -> KUnpacked {
        let mut q = [0u8; 256];
        for h in 0..2 {
            for k in 0..4 {
                for l in 0..32 {
                    q[128 * h + 32 * k + l] = (b[16 + 32 * h + l] >> (2 * k)) & 3;
                }
            }
        }
        KUnpacked {
            q,
            scales: std::array::from_fn(|j| (b[j] & 0xF) as i32),
            mins: std::array::from_fn(|j| (b[j] >> 4) as i32),
            d: f16_at(b, 80),
            dmin: f16_at(b, 82),
        }
    }
}

impl KQuant for Q3K {
    const BYTES: usize = 110;
    const OFFSET: u32 = 4;
    const HAS_MIN: bool = false;
    fn unpack(b: &[u8]) -> KUnpacked {
        let mut q = [0u8; 256];
        for h in 0..2 {
            for k in 0..4 {
                for l in 0..32 {
                    let low = (b[32 + 32 * h + l] >> (2 * k)) & 3;
                    let high = (b[l] >> (4 * h + k)) & 1;
                    q[128 * h + 32 * k + l] = low | (high << 2);
                }
            }
        }
        KUnpacked {
            q,
            scales: q3k_scales(&b[96..108]),
            mins: [0; 16],
            d: f16_at(b, 108),
            dmin: 0.0,
        }
    }
}

impl KQuant for Q4K {
    const BYTES: usize = 144;
    const OFFSET: u32 = 0;
    const HAS_MIN: bool = true;
    fn unpack(b: &[u8]) -> KUnpacked {
        let mut q = [0u8; 256];
        for c in 0..4 {
            for l in 0..32 {
                let v = b[16 + 32 * c + l];
                q[64 * c + l] = v & 0xF;
                q[64 * c + 32 + l] = v >> 4;
            }
        }
        let (sc, m) = scale_min_k4(&b[4..16]);
        KUnpacked {
            q,
            scales: std::array::from_fn(|j| sc[j / 2] as i32),
            mins: std::array::from_fn(|j| m[j / 2] as i32),
            d: f16_at(b, 0),
            dmin: f16_at(b, 2),
        }
    }
}

impl KQuant for Q5K {
    const BYTES: usize = 176;
    const OFFSET: u32 = 0;
    const HAS_MIN: bool = true;
    fn unpack(b: &[u8]) -> KUnpacked {
        let mut q = [0u8; 256];
        for c in 0..4 {
            for l in 0..32 {
                let (v, h) = (b[48 + 32 * c + l], b[16 + l]);
                q[64 * c + l] = (v & 0xF) | (((h >> (2 * c)) & 1) << 4);
                q[64 * c + 32 + l] = (v >> 4) | (((h >> (2 * c + 1)) & 1) << 4);
            }
        }
        let (sc, m) = scale_min_k4(&b[4..16]);
        KUnpacked {
            q,
            scales: std::array::from_fn(|j| sc[j / 2] as i32),
            mins: std::array::from_fn(|j| m[j / 2] as i32),
            d: f16_at(b, 0),
            dmin: f16_at(b, 2),
        }
    }
}

impl KQuant for Q6K {
    const BYTES: usize = 210;
    const OFFSET: u32 = 32;
    const HAS_MIN: bool = false;
    fn unpack(b: &[u8]) -> KUnpacked {
        let mut q = [0u8; 256];
        for h in 0..2 {
            let (ql, qh) = (&b[64 * h..64 * h + 64], &b[128 + 32 * h..128 + 32 * h + 32]);
            for l in 0..32 {
                let e = 128 * h + l;
                q[e] = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
                q[e + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
                q[e + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                q[e + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
            }
        }
        KUnpacked {
            q,
            scales: std::array::from_fn(|j| b[192 + j] as i8 as i32),
            mins: [0; 16],
            d: f16_at(b, 208),
            dmin: 0.0,
        }
    }
}

/// Float weight element types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Float {
    F32,
    F16,
    BF16,
}

impl Float {
    /// For const generics: 0 = F32, 1 = F16, 2 = BF16.
    pub(crate) const fn from_u8(v: u8) -> Float {
        match v {
            0 => Float::F32,
            1 => Float::F16,
            _ => Float::BF16,
        }
    }
}

#[inline]
pub(crate) fn float_at(ty: Float, w: &[u8], i: usize) -> f32 {
    match ty {
        Float::F32 => f32::from_le_bytes([w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]]),
        Float::F16 => f16_at(w, 2 * i),
        Float::BF16 => f32::from_bits((u16::from_le_bytes([w[2 * i], w[2 * i + 1]]) as u32) << 16),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_at_matches_half_for_every_value() {
        for h in 0..=u16::MAX {
            let want = half::f16::from_bits(h).to_f32();
            let got = f16_at(&h.to_le_bytes(), 0);
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{h:#06x}"
            );
        }
    }
}
