//! Row kernels and activation quantization against the tandem-quant reference, on every
//! instruction set this CPU has.

mod common;

use common::*;
use tandem_backend::cpu::act_quant::{self, ActFormat, QuantizedActs};
use tandem_backend::cpu::dot::{dot_f32, dot_q8, dot_q8k};
use tandem_backend::{GgmlType, Isa, ThreadPool};

/// Reference: weights dequantized by tandem-quant, activations dequantized from our quants,
/// dotted in f64. Returns (value, Σ|terms|) for the error bound.
fn reference(ty: GgmlType, w: &[u8], a: &[f64]) -> (f64, f64) {
    let mut wf = vec![0f32; a.len()];
    tandem_quant::dequantize_row(ty, w, &mut wf).unwrap();
    let dot = wf.iter().zip(a).map(|(&w, &a)| w as f64 * a).sum();
    let mag = wf.iter().zip(a).map(|(&w, &a)| (w as f64 * a).abs()).sum();
    (dot, mag)
}

/// For Q4_1 / Q5_1 the min term uses Q8_1's f16 `s` rather than `d * sum`, as ggml's dot does:
/// Σ_blocks m · (s − d·sum).
fn min_term_correction(ty: GgmlType, w: &[u8], a: act_quant::Q8Row) -> f64 {
    let block_bytes = match ty {
        GgmlType::Q4_1 => 20,
        GgmlType::Q5_1 => 24,
        _ => return 0.0,
    };
    w.chunks_exact(block_bytes)
        .enumerate()
        .map(|(b, blk)| {
            let m = half::f16::from_le_bytes([blk[2], blk[3]]).to_f64();
            m * (a.s[b] as f64 - a.d[b] as f64 * a.sum[b] as f64)
        })
        .sum()
}

fn check(ty: GgmlType, isa: Isa, got: f32, (want, mag): (f64, f64)) {
    let err = (got as f64 - want).abs();
    // The integer parts are exact; only the f32 combination of block scales rounds.
    let bound = 2e-6 * mag + 1e-30;
    assert!(
        err <= bound,
        "{ty} {isa:?}: got {got}, want {want}, err {err:e} > {bound:e}"
    );
}

#[test]
fn quantized_dots_match_reference() {
    let mut rng = Rng(1);
    let pool = ThreadPool::new(1);
    for ty in QUANT_TYPES {
        let kq = ty.block_elems() == 256;
        for &cols in if kq {
            &[256usize, 768, 2048][..]
        } else {
            &[32usize, 96, 640][..]
        } {
            for weights in 0..2 {
                let rows = 5;
                let w = if weights == 0 {
                    quantized_weights(ty, rows, cols, &mut rng)
                } else {
                    random_block_weights(ty, rows, cols, &mut rng)
                };
                let rb = w.len() / rows;
                let x = rng.vec(cols, 1.0);
                let mut acts = QuantizedActs::default();
                let format = if kq { ActFormat::Q8K } else { ActFormat::Q8 };
                acts.quantize(&pool, Isa::Scalar, format, &x, 1, cols);
                let deq: Vec<f64> = if kq {
                    let a = acts.q8k_row(0);
                    (0..cols).map(|i| a.d[i / 256] as f64 * a.qs[i] as f64).collect()
                } else {
                    let a = acts.q8_row(0);
                    (0..cols).map(|i| a.d[i / 32] as f64 * a.qs[i] as f64).collect()
                };
                for isa in Isa::available() {
                    for r in 0..rows {
                        let wr = &w[r * rb..(r + 1) * rb];
                        let (got, want) = if kq {
                            (dot_q8k(isa, ty, wr, &acts.q8k_row(0)).unwrap(), reference(ty, wr, &deq))
                        } else {
                            let (v, mag) = reference(ty, wr, &deq);
                            let fix = min_term_correction(ty, wr, acts.q8_row(0));
                            (dot_q8(isa, ty, wr, &acts.q8_row(0)).unwrap(), (v + fix, mag))
                        };
                        check(ty, isa, got, want);
                    }
                }
            }
        }
    }
}

#[test]
fn float_dots_match_reference() {
    let mut rng = Rng(2);
    for ty in FLOAT_TYPES {
        for cols in [1, 7, 16, 33, 640, 1000] {
            let w = quantized_weights(ty, 1, cols, &mut rng);
            let x = rng.vec(cols, 1.0);
            let xd: Vec<f64> = x.iter().map(|&v| v as f64).collect();
            for isa in Isa::available() {
                let got = dot_f32(isa, ty, &w, &x).unwrap();
                check(ty, isa, got, reference(ty, &w, &xd));
            }
        }
    }
}

/// The single-row kernels give the scalar level's bits at every level, float rows of every length
/// (partial chunks of 16 and 8 included) and quantized rows of one to twenty blocks.
#[test]
fn every_level_dots_with_the_scalar_bits() {
    let mut rng = Rng(3);
    let pool = ThreadPool::new(1);
    for ty in FLOAT_TYPES {
        for cols in [1, 7, 8, 15, 16, 17, 33, 640, 1000] {
            let w = quantized_weights(ty, 1, cols, &mut rng);
            let x = rng.vec(cols, 1.0);
            let want = dot_f32(Isa::Scalar, ty, &w, &x).unwrap();
            for isa in Isa::available() {
                let got = dot_f32(isa, ty, &w, &x).unwrap();
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{ty} {isa:?} cols={cols}: {got} vs {want}"
                );
            }
        }
    }
    for ty in QUANT_TYPES {
        let kq = ty.block_elems() == 256;
        for blocks in [1, 2, 3, 20] {
            let cols = blocks * ty.block_elems();
            let w = random_block_weights(ty, 1, cols, &mut rng);
            let x = rng.vec(cols, 1.0);
            let mut acts = QuantizedActs::default();
            let format = if kq { ActFormat::Q8K } else { ActFormat::Q8 };
            acts.quantize(&pool, Isa::Scalar, format, &x, 1, cols);
            let dot = |isa| {
                if kq {
                    dot_q8k(isa, ty, &w, &acts.q8k_row(0)).unwrap()
                } else {
                    dot_q8(isa, ty, &w, &acts.q8_row(0)).unwrap()
                }
            };
            let want = dot(Isa::Scalar);
            for isa in Isa::available() {
                let got = dot(isa);
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{ty} {isa:?} cols={cols}: {got} vs {want}"
                );
            }
        }
    }
}

#[test]
fn dot_rejects_bad_sizes() {
    let pool = ThreadPool::new(1);
    let mut acts = QuantizedActs::default();
    acts.quantize(&pool, Isa::Scalar, ActFormat::Q8, &[0.5; 64], 1, 64);
    let w = vec![0u8; 2 * 18];
    assert!(dot_q8(Isa::Scalar, GgmlType::Q4_0, &w[..18], &acts.q8_row(0)).is_err());
    assert!(dot_q8(Isa::Scalar, GgmlType::Q4_K, &w, &acts.q8_row(0)).is_err());
    assert!(dot_q8(Isa::Scalar, GgmlType::Q4_0, &w, &acts.q8_row(0)).is_ok());
    assert!(dot_f32(Isa::Scalar, GgmlType::F16, &w, &[1.0; 17]).is_err());
}

/// Blocks that stress rounding: exact ties at ±k.5, zeros, denormals, huge and non-finite values.
fn tricky_rows(rng: &mut Rng, n: usize) -> Vec<Vec<f32>> {
    let mut rows = vec![rng.vec(n, 1.0), vec![0.0; n]];
    // amax = 127 makes the scale 1, so x·(1/d) = x exactly and .5 values are ties.
    let ties: Vec<f32> = (0..n)
        .map(|i| if i % 32 == 0 { 127.0 } else { (i % 17) as f32 - 8.5 })
        .collect();
    rows.push(ties.clone());
    rows.push(ties.iter().map(|v| -v).collect());
    rows.push((0..n).map(|i| if i % 5 == 0 { 1e-41 } else { 0.0 }).collect());
    rows.push((0..n).map(|i| (i as f32 * 1.7).sin() * 3e38).collect());
    let mut special = rng.vec(n, 1.0);
    special[3] = f32::INFINITY;
    special[40 % n] = f32::NAN;
    special[n - 1] = f32::NEG_INFINITY;
    rows.push(special);
    // Largest magnitude appears with both signs: the first one decides the Q8_K sign.
    rows.push(
        (0..n)
            .map(|i| {
                if i % 7 == 0 {
                    2.0
                } else if i % 7 == 3 {
                    -2.0
                } else {
                    0.3
                }
            })
            .collect(),
    );
    rows
}

#[test]
fn act_quant_simd_matches_scalar_bytes() {
    let mut rng = Rng(3);
    for x in tricky_rows(&mut rng, 512) {
        let mut want = (vec![0i8; 512], vec![0f32; 16], vec![0i32; 16], vec![0f32; 16]);
        act_quant::quantize_row_q8(Isa::Scalar, &x, &mut want.0, &mut want.1, &mut want.2, &mut want.3);
        let mut want_k = (vec![0i8; 512], vec![0f32; 2], vec![0i16; 32]);
        act_quant::quantize_row_q8k(Isa::Scalar, &x, &mut want_k.0, &mut want_k.1, &mut want_k.2);
        for isa in Isa::available() {
            let mut got = (vec![0i8; 512], vec![0f32; 16], vec![0i32; 16], vec![0f32; 16]);
            act_quant::quantize_row_q8(isa, &x, &mut got.0, &mut got.1, &mut got.2, &mut got.3);
            assert_eq!(got.0, want.0, "{isa:?}");
            assert_eq!(got.2, want.2, "{isa:?}");
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got.1), bits(&want.1), "{isa:?}");
            assert_eq!(bits(&got.3), bits(&want.3), "{isa:?}");
            let mut got_k = (vec![0i8; 512], vec![0f32; 2], vec![0i16; 32]);
            act_quant::quantize_row_q8k(isa, &x, &mut got_k.0, &mut got_k.1, &mut got_k.2);
            assert_eq!(got_k.0, want_k.0, "{isa:?}");
            assert_eq!(bits(&got_k.1), bits(&want_k.1), "{isa:?}");
            assert_eq!(got_k.2, want_k.2, "{isa:?}");
        }
    }
}

/// llama.cpp's x86 `quantize_row_q8_0`/`_q8_1` for one block, written plainly: the reference the
/// activation quantizer must reproduce (it differs from ggml's `_ref` quantizer in rounding ties to
/// even and in multiplying by `127 / amax`).
fn llama_cpp_q8_block(x: &[f32]) -> (Vec<i8>, half::f16, half::f16) {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let q: Vec<i8> = x.iter().map(|&v| (v * id).round_ties_even() as i8).collect();
    let sum: i32 = q.iter().map(|&v| v as i32).sum();
    (q, half::f16::from_f32(d), half::f16::from_f32(d * sum as f32))
}

#[test]
fn act_quant_matches_llama_cpp_quantizers() {
    let mut rng = Rng(4);
    let rows: Vec<Vec<f32>> = tricky_rows(&mut rng, 256)
        .into_iter()
        .filter(|r| r.iter().all(|v| v.is_finite()))
        .collect();
    for x in rows {
        let mut q = (vec![0i8; 256], vec![0f32; 8], vec![0i32; 8], vec![0f32; 8]);
        act_quant::quantize_row_q8(Isa::detect(), &x, &mut q.0, &mut q.1, &mut q.2, &mut q.3);
        for b in 0..8 {
            let (qs, d, s) = llama_cpp_q8_block(&x[32 * b..32 * b + 32]);
            assert_eq!(&q.0[32 * b..32 * b + 32], &qs[..]);
            assert_eq!(q.1[b].to_bits(), d.to_f32().to_bits());
            assert_eq!(q.2[b], qs.iter().map(|&v| v as i32).sum::<i32>());
            assert_eq!(q.3[b].to_bits(), s.to_f32().to_bits());
        }
        let mut k = (vec![0i8; 256], vec![0f32; 1], vec![0i16; 16]);
        act_quant::quantize_row_q8k(Isa::detect(), &x, &mut k.0, &mut k.1, &mut k.2);
        let r = tandem_quant::quantize(GgmlType::Q8_K, &x).unwrap();
        assert_eq!(k.1[0].to_le_bytes(), r[..4]);
        assert!(k.0.iter().zip(&r[4..260]).all(|(&a, &b)| a == b as i8));
        let bs: Vec<i16> = r[260..].chunks(2).map(|c| i16::from_le_bytes([c[0], c[1]])).collect();
        assert_eq!(k.2, bs);
    }
}
