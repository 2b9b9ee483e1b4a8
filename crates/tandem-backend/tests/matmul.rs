//! `matmul`: bit-exactness across batch sizes, thread counts and routes; accuracy against a
//! float reference; odd shapes; size validation.

mod common;

use common::*;
use tandem_backend::{matmul, BackendError, GgmlType, Isa, ThreadPool, WeightMatrix};

fn all_types() -> Vec<GgmlType> {
    QUANT_TYPES.iter().chain(&FLOAT_TYPES).copied().collect()
}

fn run(pool: &ThreadPool, w: &WeightMatrix, x: &[f32], t: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; t * w.rows];
    matmul(pool, w, &x[..t * w.cols], t, &mut out).unwrap();
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

/// A 2-thread pool at every instruction-set level this CPU has.
fn level_pools() -> Vec<ThreadPool> {
    Isa::available()
        .into_iter()
        .map(|isa| ThreadPool::with_isa(2, isa))
        .collect()
}

/// Every output of a 64-row batch equals the same row computed alone, in a batch of 7, and
/// with 1, 2 or 3 threads — on every ISA level and type.
#[test]
fn results_do_not_depend_on_batch_threads_or_route() {
    let mut rng = Rng(10);
    for isa in Isa::available() {
        let pools: Vec<ThreadPool> = [1, 2, 3].map(|n| ThreadPool::with_isa(n, isa)).into();
        for ty in all_types() {
            let (rows, cols) = (37, cols_for(ty, 512));
            let data = random_block_weights(ty, rows, cols, &mut rng);
            let w = WeightMatrix {
                ty,
                data: &data,
                rows,
                cols,
            };
            let x = rng.vec(64 * cols, 1.0);
            let full = run(&pools[1], &w, &x, 64);
            assert!(full.iter().all(|v| v.is_finite()), "{ty} {isa:?}");
            for pool in &pools {
                assert_eq!(
                    bits(&run(pool, &w, &x, 64)),
                    bits(&full),
                    "{ty} {isa:?} t=64 threads={}",
                    pool.n_threads()
                );
                // Two to eight rows take the row kernels (legacy types and K-quants at AVX2 and
                // AVX-512 two, three and four activation rows a pass), nine the AVX-512 GEMM (the
                // AVX2 GEMM takes 16 rows on, as t = 64 does here, but for Q8_0), with the same bits.
                for t in 2..=9 {
                    assert_eq!(
                        bits(&run(pool, &w, &x, t)),
                        bits(&full[..t * rows]),
                        "{ty} {isa:?} t={t}"
                    );
                }
            }
            for r in [0, 3, 15, 16, 17, 31, 32, 63] {
                let alone = run(&pools[0], &w, &x[r * cols..], 1);
                assert_eq!(
                    bits(&alone),
                    bits(&full[r * rows..(r + 1) * rows]),
                    "{ty} {isa:?} row {r}"
                );
            }
        }
    }
}

/// Every ISA level gives the scalar level's bits, for every type, on one row (the decode route),
/// small batches (the batched row kernels) and large ones (the AVX-512 GEMM), with float rows
/// that end in a partial chunk of 16: a model's logits do not depend on the machine it runs on.
#[test]
fn every_isa_level_gives_the_scalar_bits() {
    let mut rng = Rng(14);
    let scalar = ThreadPool::with_isa(2, Isa::Scalar);
    let levels = level_pools();
    for ty in all_types() {
        for base in [40, 640] {
            let (rows, cols) = (29, cols_for(ty, base));
            for weights in 0..2 {
                let data = if weights == 0 {
                    quantized_weights(ty, rows, cols, &mut rng)
                } else {
                    random_block_weights(ty, rows, cols, &mut rng)
                };
                let w = WeightMatrix {
                    ty,
                    data: &data,
                    rows,
                    cols,
                };
                let x = rng.vec(20 * cols, 1.0);
                for t in [1, 3, 4, 9, 16, 20] {
                    let want = run(&scalar, &w, &x, t);
                    assert!(want.iter().all(|v| v.is_finite()), "{ty} cols={cols} t={t}");
                    for pool in &levels {
                        assert_eq!(
                            bits(&run(pool, &w, &x, t)),
                            bits(&want),
                            "{ty} {:?} cols={cols} t={t} weights={weights}",
                            pool.isa()
                        );
                    }
                }
            }
        }
    }
}

/// Batches that leave partial tiles everywhere: rows not a multiple of the tile height, batch
/// sizes around multiples of 16 and 32, row counts spanning several tasks; and 2-5 rows, which the
/// row kernels take two and four at a time, with weight rows not a multiple of four.
#[test]
fn odd_shapes_are_exact() {
    let mut rng = Rng(11);
    let pool = ThreadPool::new(2);
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::F16,
    ] {
        for (rows, t) in [
            (1, 1),
            (1, 40),
            (3, 2),
            (5, 33),
            (130, 17),
            (257, 48),
            (66, 31),
            (7, 4),
            (66, 3),
            (130, 5),
        ] {
            let cols = cols_for(ty, 288);
            let data = quantized_weights(ty, rows, cols, &mut rng);
            let w = WeightMatrix {
                ty,
                data: &data,
                rows,
                cols,
            };
            let x = rng.vec(t * cols, 1.0);
            let full = run(&pool, &w, &x, t);
            for r in 0..t {
                let alone = run(&pool, &w, &x[r * cols..], 1);
                assert_eq!(
                    bits(&alone),
                    bits(&full[r * rows..(r + 1) * rows]),
                    "{ty} rows={rows} t={t} r={r}"
                );
            }
        }
    }
}

/// Against weights dequantized by tandem-quant and unquantized activations, in f64: the only
/// error beyond float rounding is activation quantization, at most half a step per element.
#[test]
fn matches_float_reference() {
    let mut rng = Rng(12);
    let pool = ThreadPool::new(2);
    for ty in all_types() {
        let (rows, cols, t) = (19, cols_for(ty, 512), 5);
        let data = quantized_weights(ty, rows, cols, &mut rng);
        let w = WeightMatrix {
            ty,
            data: &data,
            rows,
            cols,
        };
        let x = rng.vec(t * cols, 1.0);
        let out = run(&pool, &w, &x, t);
        let wf = tandem_quant::dequantize(ty, &data).unwrap();
        let block = match ty.block_elems() {
            256 => 256,
            1 => 1,
            _ => 32,
        };
        for r in 0..t {
            let xr = &x[r * cols..(r + 1) * cols];
            for j in 0..rows {
                let wr = &wf[j * cols..(j + 1) * cols];
                let want: f64 = wr.iter().zip(xr).map(|(&a, &b)| a as f64 * b as f64).sum();
                let mut bound = 1e-5
                    * wr.iter()
                        .zip(xr)
                        .map(|(&a, &b)| (a as f64 * b as f64).abs())
                        .sum::<f64>();
                if block > 1 {
                    for (wb, xb) in wr.chunks(block).zip(xr.chunks(block)) {
                        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
                        bound += wb.iter().map(|v| v.abs() as f64).sum::<f64>() * amax / 254.0 * 1.01;
                    }
                }
                let got = out[r * rows + j] as f64;
                assert!(
                    (got - want).abs() <= bound,
                    "{ty} r={r} j={j}: got {got} want {want} bound {bound}"
                );
            }
        }
    }
}

#[test]
fn degenerate_sizes() {
    let pool = ThreadPool::new(2);
    let data = vec![0u8; 0];
    let w = WeightMatrix {
        ty: GgmlType::Q8_0,
        data: &data,
        rows: 0,
        cols: 64,
    };
    matmul(&pool, &w, &[0.0; 128], 2, &mut []).unwrap();
    let w = WeightMatrix {
        ty: GgmlType::Q8_0,
        data: &data,
        rows: 3,
        cols: 0,
    };
    let mut out = [1.0; 6];
    matmul(&pool, &w, &[], 2, &mut out).unwrap();
    assert_eq!(out, [0.0; 6]);
    let data = vec![0u8; 3 * 34];
    let w = WeightMatrix {
        ty: GgmlType::Q8_0,
        data: &data,
        rows: 3,
        cols: 32,
    };
    matmul(&pool, &w, &[], 0, &mut []).unwrap();
}

#[test]
fn size_mismatches_are_errors() {
    let pool = ThreadPool::new(2);
    let data = vec![0u8; 4 * 2 * 18];
    let ok = WeightMatrix {
        ty: GgmlType::Q4_0,
        data: &data,
        rows: 4,
        cols: 64,
    };
    let x = vec![0.0f32; 3 * 64];
    let mut out = vec![0.0f32; 3 * 4];
    matmul(&pool, &ok, &x, 3, &mut out).unwrap();

    let e = matmul(&pool, &WeightMatrix { rows: 5, ..ok }, &x, 3, &mut out).unwrap_err();
    assert!(
        matches!(
            e,
            BackendError::WeightSize {
                expected: 180,
                got: 144,
                ..
            }
        ),
        "{e}"
    );
    let e = matmul(&pool, &WeightMatrix { cols: 48, ..ok }, &x, 3, &mut out).unwrap_err();
    assert!(matches!(e, BackendError::NotWholeBlocks { block: 32, .. }), "{e}");
    let e = matmul(
        &pool,
        &WeightMatrix {
            ty: GgmlType::IQ4_NL,
            ..ok
        },
        &x,
        3,
        &mut out,
    )
    .unwrap_err();
    assert_eq!(e, BackendError::UnsupportedType(GgmlType::IQ4_NL));
    let e = matmul(&pool, &ok, &x[1..], 3, &mut out).unwrap_err();
    assert!(
        matches!(
            e,
            BackendError::InputSize {
                expected: 192,
                got: 191,
                ..
            }
        ),
        "{e}"
    );
    let e = matmul(&pool, &ok, &x, 3, &mut out[1..]).unwrap_err();
    assert!(
        matches!(
            e,
            BackendError::OutputSize {
                expected: 12,
                got: 11,
                ..
            }
        ),
        "{e}"
    );
    let e = matmul(&pool, &ok, &x, usize::MAX, &mut out).unwrap_err();
    assert_eq!(e, BackendError::Overflow);
    assert!(!e.to_string().is_empty());
}

/// The public single-row kernels agree bit for bit with `matmul` (which uses the multi-row
/// kernels for one activation row and the GEMM for batches) at every ISA level.
#[test]
fn single_row_kernels_agree_with_matmul() {
    use tandem_backend::cpu::act_quant::{ActFormat, QuantizedActs};
    use tandem_backend::cpu::dot::{dot_f32, dot_q8, dot_q8k};
    let mut rng = Rng(13);
    for isa in Isa::available() {
        let pool = ThreadPool::with_isa(2, isa);
        for ty in all_types() {
            let (rows, cols) = (23, cols_for(ty, 512));
            let data = random_block_weights(ty, rows, cols, &mut rng);
            let w = WeightMatrix {
                ty,
                data: &data,
                rows,
                cols,
            };
            let x = rng.vec(8 * cols, 1.0);
            let batch = run(&pool, &w, &x, 8);
            let rb = data.len() / rows;
            let mut acts = QuantizedActs::default();
            let kq = ty.block_elems() == 256;
            let format = if kq { ActFormat::Q8K } else { ActFormat::Q8 };
            acts.quantize(&pool, isa, format, &x, 8, cols);
            for r in 0..8 {
                for j in 0..rows {
                    let wr = &data[j * rb..(j + 1) * rb];
                    let v = match ty.block_elems() {
                        1 => dot_f32(isa, ty, wr, &x[r * cols..(r + 1) * cols]),
                        256 => dot_q8k(isa, ty, wr, &acts.q8k_row(r)),
                        _ => dot_q8(isa, ty, wr, &acts.q8_row(r)),
                    }
                    .unwrap();
                    assert_eq!(v.to_bits(), batch[r * rows + j].to_bits(), "{ty} {isa:?} r={r} j={j}");
                }
            }
        }
    }
}

/// Nibble types at their largest products: every quant at its top value (15, or 31 with the fifth
/// bit) against activations at ±127, where the AVX2 row kernels add eight products in i16 lanes
/// before widening. Every level and batch of up to four rows gives the scalar bits.
#[test]
fn largest_nibble_products_are_exact() {
    let scalar = ThreadPool::with_isa(1, Isa::Scalar);
    let levels = level_pools();
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1] {
        let (rows, cols) = (9, 128);
        let mut data = vec![0xFFu8; rows * cols / ty.block_elems() * ty.block_bytes()];
        let one = half::f16::from_f32(1.0).to_le_bytes();
        for block in data.chunks_exact_mut(ty.block_bytes()) {
            block[..2].copy_from_slice(&one);
            if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
                block[2..4].fill(0);
            }
        }
        let w = WeightMatrix {
            ty,
            data: &data,
            rows,
            cols,
        };
        for sign in [1.0f32, -1.0] {
            let x = vec![sign; 4 * cols];
            for t in 1..=4 {
                let want = run(&scalar, &w, &x, t);
                assert_eq!(want[0], want[rows - 1], "{ty}");
                for pool in &levels {
                    assert_eq!(
                        bits(&run(pool, &w, &x, t)),
                        bits(&want),
                        "{ty} {:?} t={t} sign={sign}",
                        pool.isa()
                    );
                }
            }
        }
    }
}
