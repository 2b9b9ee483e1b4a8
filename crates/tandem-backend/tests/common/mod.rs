//! Shared test helpers: a small deterministic PRNG and random weight matrices in every type.
#![allow(dead_code)]

use tandem_backend::GgmlType;

pub const QUANT_TYPES: [GgmlType; 10] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];
pub const FLOAT_TYPES: [GgmlType; 3] = [GgmlType::F32, GgmlType::F16, GgmlType::BF16];

/// SplitMix64.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// Roughly normal (sum of uniforms), scaled.
    pub fn normal(&mut self, scale: f32) -> f32 {
        (self.uniform() + self.uniform() + self.uniform()) * scale
    }

    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.normal(scale)).collect()
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

/// Smallest column count that is a whole number of blocks for every type in the list.
pub fn cols_for(ty: GgmlType, base: usize) -> usize {
    base.next_multiple_of(ty.block_elems())
}

/// `rows × cols` weights of type `ty`: quantized from random values by tandem-quant, so they
/// are realistic (scales matching the data).
pub fn quantized_weights(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let x = rng.vec(rows * cols, 0.05);
    let mut out = Vec::new();
    for r in x.chunks(cols) {
        out.extend(tandem_quant::quantize(ty, r).unwrap());
    }
    out
}

/// Offsets of the f16 scale fields of a block, so random blocks can be given sane scales.
fn scale_fields(ty: GgmlType) -> &'static [usize] {
    use GgmlType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 => &[0],
        Q4_1 | Q5_1 | Q4_K | Q5_K => &[0, 2],
        Q2_K => &[80, 82],
        Q3_K => &[108],
        Q6_K => &[208],
        _ => &[],
    }
}

/// Random bytes in every bit position (extreme quants and scales included), with finite f16
/// block scales of moderate size. Float types get random finite values.
pub fn random_block_weights(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    if matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
        return quantized_weights(ty, rows, cols, rng);
    }
    let n = rows * cols / ty.block_elems() * ty.block_bytes();
    let mut b = rng.bytes(n);
    for blk in b.chunks_exact_mut(ty.block_bytes()) {
        for &off in scale_fields(ty) {
            let v = half::f16::from_f32(rng.uniform() * 0.01);
            blk[off..off + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    b
}
