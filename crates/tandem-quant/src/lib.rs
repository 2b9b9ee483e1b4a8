//! ggml's quantized block formats: bit-exact layouts with scalar reference dequantizers and
//! quantizers (ports of the `*_ref` routines in llama.cpp's `ggml-quants.c`).
//!
//! A row of `n` elements of type `ty` is `n / block_elems` blocks stored back to back, each
//! `block_bytes` long ([`GgmlType::block_geometry`]). Supported types: F32, F16, BF16, Q4_0, Q4_1,
//! Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K; the byte layout of each is documented in
//! its module under [`formats`].
//!
//! These routines are the reference for correctness, not the fast path: they favour clarity over
//! speed (still well under a second per million elements in release builds).

pub mod formats;

pub use tandem_gguf::GgmlType;

/// Why a conversion was refused. The public functions never panic on bad sizes.
#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    #[error("tensor type {0} is not supported by tandem-quant")]
    Unsupported(GgmlType),
    #[error("{ty}: {n} elements is not a whole number of {}-element blocks", .ty.block_elems())]
    NotWholeBlocks { ty: GgmlType, n: usize },
    #[error("{ty}: expected {expected} bytes of quantized data, got {got}")]
    SizeMismatch { ty: GgmlType, expected: usize, got: usize },
}

/// Whether this crate can quantize and dequantize `ty`.
pub fn is_supported(ty: GgmlType) -> bool {
    block_fns(ty).is_ok()
}

type DequantizeBlock = fn(&[u8], &mut [f32]);
type QuantizeBlock = fn(&[f32], &mut [u8]);

/// The block functions of `ty`'s format module. Their geometry is `ty.block_geometry()` (each
/// module's `BLOCK_ELEMS`/`BLOCK_BYTES` are tested to match).
fn block_fns(ty: GgmlType) -> Result<(DequantizeBlock, QuantizeBlock), QuantError> {
    use formats as f;
    use GgmlType::*;
    Ok(match ty {
        F32 => (f::f32::dequantize_block, f::f32::quantize_block),
        F16 => (f::f16::dequantize_block, f::f16::quantize_block),
        BF16 => (f::bf16::dequantize_block, f::bf16::quantize_block),
        Q4_0 => (f::q4_0::dequantize_block, f::q4_0::quantize_block),
        Q4_1 => (f::q4_1::dequantize_block, f::q4_1::quantize_block),
        Q5_0 => (f::q5_0::dequantize_block, f::q5_0::quantize_block),
        Q5_1 => (f::q5_1::dequantize_block, f::q5_1::quantize_block),
        Q8_0 => (f::q8_0::dequantize_block, f::q8_0::quantize_block),
        Q2_K => (f::q2_k::dequantize_block, f::q2_k::quantize_block),
        Q3_K => (f::q3_k::dequantize_block, f::q3_k::quantize_block),
        Q4_K => (f::q4_k::dequantize_block, f::q4_k::quantize_block),
        Q5_K => (f::q5_k::dequantize_block, f::q5_k::quantize_block),
        Q6_K => (f::q6_k::dequantize_block, f::q6_k::quantize_block),
        Q8_K => (f::q8_k::dequantize_block, f::q8_k::quantize_block),
        other => return Err(QuantError::Unsupported(other)),
    })
}

/// Bytes of `n` elements of a supported `ty`, checking that `n` is a whole number of blocks.
fn row_bytes(ty: GgmlType, n: usize) -> Result<usize, QuantError> {
    block_fns(ty)?;
    let (elems, bytes) = ty.block_geometry();
    if !n.is_multiple_of(elems) {
        return Err(QuantError::NotWholeBlocks { ty, n });
    }
    // Cannot overflow: no format stores more bytes per element than an f32 does.
    Ok(n / elems * bytes)
}

/// Dequantizes one row: `dst.len()` elements from `src`, which must hold exactly that many.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    let expected = row_bytes(ty, dst.len())?;
    if src.len() != expected {
        return Err(QuantError::SizeMismatch {
            ty,
            expected,
            got: src.len(),
        });
    }
    let (dequantize_block, _) = block_fns(ty)?;
    let (elems, bytes) = ty.block_geometry();
    for (b, y) in src.chunks_exact(bytes).zip(dst.chunks_exact_mut(elems)) {
        dequantize_block(b, y);
    }
    Ok(())
}

/// Quantizes one row: `src.len()` elements into `dst`, which must be exactly the row's size.
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    let expected = row_bytes(ty, src.len())?;
    if dst.len() != expected {
        return Err(QuantError::SizeMismatch {
            ty,
            expected,
            got: dst.len(),
        });
    }
    let (_, quantize_block) = block_fns(ty)?;
    let (elems, bytes) = ty.block_geometry();
    for (x, b) in src.chunks_exact(elems).zip(dst.chunks_exact_mut(bytes)) {
        quantize_block(x, b);
    }
    Ok(())
}

/// Dequantizes whole blocks; the element count is inferred from `src.len()`. A length that is
/// not a whole number of blocks is a `SizeMismatch` whose `expected` is the length rounded down.
pub fn dequantize(ty: GgmlType, src: &[u8]) -> Result<Vec<f32>, QuantError> {
    block_fns(ty)?;
    let (elems, bytes) = ty.block_geometry();
    if !src.len().is_multiple_of(bytes) {
        let expected = src.len() / bytes * bytes;
        return Err(QuantError::SizeMismatch {
            ty,
            expected,
            got: src.len(),
        });
    }
    let mut out = vec![0.0; src.len() / bytes * elems];
    dequantize_row(ty, src, &mut out)?;
    Ok(out)
}

/// Quantizes `src`, whose length must be a whole number of blocks.
pub fn quantize(ty: GgmlType, src: &[f32]) -> Result<Vec<u8>, QuantError> {
    let mut out = vec![0u8; row_bytes(ty, src.len())?];
    quantize_row(ty, src, &mut out)?;
    Ok(out)
}
