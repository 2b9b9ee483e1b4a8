//! Geometry, supported types and error handling of the public API.

use tandem_quant::formats::*;
use tandem_quant::{dequantize, dequantize_row, is_supported, quantize, quantize_row, GgmlType, QuantError};

#[test]
fn block_geometry_matches_gguf() {
    let table: [(GgmlType, usize, usize); 14] = [
        (GgmlType::F32, f32::BLOCK_ELEMS, f32::BLOCK_BYTES),
        (GgmlType::F16, f16::BLOCK_ELEMS, f16::BLOCK_BYTES),
        (GgmlType::BF16, bf16::BLOCK_ELEMS, bf16::BLOCK_BYTES),
        (GgmlType::Q4_0, q4_0::BLOCK_ELEMS, q4_0::BLOCK_BYTES),
        (GgmlType::Q4_1, q4_1::BLOCK_ELEMS, q4_1::BLOCK_BYTES),
        (GgmlType::Q5_0, q5_0::BLOCK_ELEMS, q5_0::BLOCK_BYTES),
        (GgmlType::Q5_1, q5_1::BLOCK_ELEMS, q5_1::BLOCK_BYTES),
        (GgmlType::Q8_0, q8_0::BLOCK_ELEMS, q8_0::BLOCK_BYTES),
        (GgmlType::Q2_K, q2_k::BLOCK_ELEMS, q2_k::BLOCK_BYTES),
        (GgmlType::Q3_K, q3_k::BLOCK_ELEMS, q3_k::BLOCK_BYTES),
        (GgmlType::Q4_K, q4_k::BLOCK_ELEMS, q4_k::BLOCK_BYTES),
        (GgmlType::Q5_K, q5_k::BLOCK_ELEMS, q5_k::BLOCK_BYTES),
        (GgmlType::Q6_K, q6_k::BLOCK_ELEMS, q6_k::BLOCK_BYTES),
        (GgmlType::Q8_K, q8_k::BLOCK_ELEMS, q8_k::BLOCK_BYTES),
    ];
    for (ty, elems, bytes) in table {
        assert_eq!(ty.block_geometry(), (elems, bytes), "{ty}");
        assert!(is_supported(ty), "{ty}");
    }
    let supported = GgmlType::ALL.iter().filter(|t| is_supported(**t)).count();
    assert_eq!(supported, 14);
}

#[test]
fn unsupported_types_are_refused() {
    for ty in [GgmlType::IQ2_XXS, GgmlType::Q8_1, GgmlType::I32, GgmlType::MXFP4] {
        assert!(!is_supported(ty));
        let n = ty.block_elems();
        let b = ty.block_bytes();
        assert!(matches!(quantize(ty, &vec![0.0; n]), Err(QuantError::Unsupported(t)) if t == ty));
        assert!(matches!(dequantize(ty, &vec![0; b]), Err(QuantError::Unsupported(t)) if t == ty));
        let mut y = vec![0.0; n];
        assert!(matches!(
            dequantize_row(ty, &vec![0; b], &mut y),
            Err(QuantError::Unsupported(_))
        ));
        let mut q = vec![0; b];
        assert!(matches!(quantize_row(ty, &y, &mut q), Err(QuantError::Unsupported(_))));
    }
    let e = quantize(GgmlType::IQ2_XXS, &[0.0; 256]).unwrap_err();
    assert_eq!(e.to_string(), "tensor type IQ2_XXS is not supported by tandem-quant");
}

#[test]
fn partial_blocks_are_refused() {
    let e = quantize(GgmlType::Q4_K, &[0.0; 300]).unwrap_err();
    assert!(matches!(
        e,
        QuantError::NotWholeBlocks {
            ty: GgmlType::Q4_K,
            n: 300
        }
    ));
    assert_eq!(
        e.to_string(),
        "Q4_K: 300 elements is not a whole number of 256-element blocks"
    );

    let mut y = [0.0; 33];
    let e = dequantize_row(GgmlType::Q8_0, &[0; 34], &mut y).unwrap_err();
    assert!(matches!(
        e,
        QuantError::NotWholeBlocks {
            ty: GgmlType::Q8_0,
            n: 33
        }
    ));

    let mut q = [0u8; 18];
    let e = quantize_row(GgmlType::Q4_0, &[0.0; 31], &mut q).unwrap_err();
    assert!(matches!(e, QuantError::NotWholeBlocks { n: 31, .. }));
}

#[test]
fn wrong_byte_lengths_are_refused() {
    let mut y = [0.0; 64];
    let e = dequantize_row(GgmlType::Q4_0, &[0; 35], &mut y).unwrap_err();
    assert!(matches!(
        e,
        QuantError::SizeMismatch {
            ty: GgmlType::Q4_0,
            expected: 36,
            got: 35
        }
    ));
    assert_eq!(e.to_string(), "Q4_0: expected 36 bytes of quantized data, got 35");

    let mut q = [0u8; 145];
    let e = quantize_row(GgmlType::Q4_K, &[0.0; 256], &mut q).unwrap_err();
    assert!(matches!(
        e,
        QuantError::SizeMismatch {
            expected: 144,
            got: 145,
            ..
        }
    ));

    let e = dequantize(GgmlType::Q6_K, &[0; 211]).unwrap_err();
    assert!(matches!(
        e,
        QuantError::SizeMismatch {
            expected: 210,
            got: 211,
            ..
        }
    ));
    let e = dequantize(GgmlType::F32, &[0; 7]).unwrap_err();
    assert!(matches!(
        e,
        QuantError::SizeMismatch {
            expected: 4,
            got: 7,
            ..
        }
    ));
}

#[test]
fn empty_input_is_fine() {
    assert!(quantize(GgmlType::Q4_K, &[]).unwrap().is_empty());
    assert!(dequantize(GgmlType::Q2_K, &[]).unwrap().is_empty());
    dequantize_row(GgmlType::Q8_0, &[], &mut []).unwrap();
}
