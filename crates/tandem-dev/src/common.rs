//! What the benchmarks share: the random inputs (fixed seeds, so runs time the same data), the
//! weights they time, and the rows of the report.

use anyhow::{Context, Result};
use tandem_cuda::{CudaSlice, Gpu};
use tandem_gguf::GgmlType;

/// A small xorshift generator.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Roughly normal: the sum of four uniforms, centred and scaled.
    pub fn normal(&mut self) -> f32 {
        let u: f32 = (0..4).map(|_| (self.next() >> 40) as f32 / (1u64 << 24) as f32).sum();
        (u - 2.0) * 1.7
    }
}

/// One timing of the report.
pub struct Row {
    pub what: String,
    pub result: String,
}

/// Quantized rows of `ty`: 64 distinct random rows, tiled to `rows` (real block contents, no hour of
/// quantizing), as host bytes.
pub fn host_weights(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Result<Vec<u8>> {
    let row_bytes = ty.row_bytes(cols as u64).context("row size")? as usize;
    let mut tile = vec![0u8; 64 * row_bytes];
    for r in 0..64 {
        let src: Vec<f32> = (0..cols).map(|_| rng.normal() * 0.05).collect();
        tandem_quant::quantize_row(ty, &src, &mut tile[r * row_bytes..(r + 1) * row_bytes])?;
    }
    Ok(tile.iter().copied().cycle().take(rows * row_bytes).collect())
}

/// `n` device copies of `host_weights`.
pub fn tiled_weights(
    gpu: &Gpu,
    rng: &mut Rng,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    n: usize,
) -> Result<Vec<CudaSlice<u8>>> {
    let host = host_weights(rng, ty, rows, cols)?;
    Ok((0..n).map(|_| gpu.upload(&host)).collect::<Result<_, _>>()?)
}
