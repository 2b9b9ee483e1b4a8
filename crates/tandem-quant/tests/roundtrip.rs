//! Quantize → dequantize round trips on pseudo-random data, with per-type error bounds.

mod common;

use common::{rows, ROW};
use tandem_quant::{dequantize, dequantize_row, quantize, quantize_row, GgmlType};

const TYPES: [GgmlType; 14] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
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
    GgmlType::Q8_K,
];

fn rms(x: &[f32]) -> f64 {
    (x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / x.len() as f64).sqrt()
}

fn rel_rmse(x: &[f32], y: &[f32]) -> f64 {
    let err: Vec<f32> = x.iter().zip(y).map(|(a, b)| a - b).collect();
    rms(&err) / rms(x)
}

fn round_trip(ty: GgmlType, x: &[f32]) -> Vec<f32> {
    let q = quantize(ty, x).unwrap();
    assert_eq!(q.len() as u64, ty.row_bytes(x.len() as u64).unwrap());
    dequantize(ty, &q).unwrap()
}

/// Upper bounds on RMSE / RMS over all rows together, and on any single row (the worst rows are
/// the ones with outliers). Set about 10-15% above what ggml's reference algorithms achieve here;
/// a wrong layout or a broken scale search lands far above them.
fn bounds(ty: GgmlType) -> (f64, f64) {
    use GgmlType::*;
    match ty {
        F32 => (0.0, 0.0),
        F16 => (3e-4, 3e-4),
        BF16 => (2e-3, 2.5e-3),
        Q8_0 => (0.006, 0.013),
        Q8_K => (0.0075, 0.035),
        Q6_K => (0.02, 0.037),
        Q5_0 => (0.05, 0.1),
        Q5_1 => (0.043, 0.06),
        Q5_K => (0.041, 0.056),
        Q4_0 => (0.095, 0.18),
        Q4_1 => (0.088, 0.115),
        Q4_K => (0.08, 0.11),
        Q3_K => (0.165, 0.2),
        Q2_K => (0.33, 0.35),
        _ => unreachable!(),
    }
}

#[test]
fn round_trip_error_is_bounded() {
    let mut report = String::new();
    let mut failures = Vec::new();
    for ty in TYPES {
        let (total_bound, row_bound) = bounds(ty);
        let (mut xs, mut ys) = (Vec::new(), Vec::new());
        let mut worst = (0.0, "");
        for seed in 0..4 {
            for (kind, x) in rows(seed) {
                let y = round_trip(ty, &x);
                let e = rel_rmse(&x, &y);
                if e > worst.0 {
                    worst = (e, kind);
                }
                if e > row_bound {
                    failures.push(format!("{ty} {kind} seed {seed}: relative RMSE {e} > {row_bound}"));
                }
                xs.extend_from_slice(&x);
                ys.extend_from_slice(&y);
            }
        }
        let e = rel_rmse(&xs, &ys);
        report += &format!("{ty}: total {e:.5}, worst row {:.5} ({})\n", worst.0, worst.1);
        if e > total_bound {
            failures.push(format!("{ty}: relative RMSE {e} > {total_bound}"));
        }
    }
    println!("{report}");
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn zero_rows_stay_zero() {
    let x = vec![0.0f32; ROW];
    for ty in TYPES {
        let y = round_trip(ty, &x);
        assert!(y.iter().all(|&v| v == 0.0), "{ty}: zeros did not survive");
    }
}

#[test]
fn constant_rows_are_nearly_exact() {
    for ty in TYPES {
        for c in [3.25f32, -0.75, 0.125] {
            let x = vec![c; ROW];
            let y = round_trip(ty, &x);
            let tol = if ty == GgmlType::BF16 { 4e-3 } else { 1e-3 };
            for &v in &y {
                assert!((v - c).abs() <= tol * c.abs(), "{ty}: constant {c} came back as {v}");
            }
        }
    }
}

/// Quantizing already-dequantized data gives the same values back (within float noise).
#[test]
fn requantizing_is_idempotent_for_simple_types() {
    use GgmlType::*;
    for ty in [F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_K] {
        for (kind, x) in rows(7) {
            let y1 = round_trip(ty, &x);
            let y2 = round_trip(ty, &y1);
            let scale = rms(&x) as f32;
            for (i, (a, b)) in y1.iter().zip(&y2).enumerate() {
                assert!((a - b).abs() <= 1e-3 * scale, "{ty} {kind} [{i}]: {a} then {b}");
            }
        }
    }
}

/// Row functions work on slices inside larger buffers and agree with the whole-buffer ones.
#[test]
fn row_api_matches_whole_api() {
    let x = &rows(3)[0].1;
    for ty in TYPES {
        let whole = quantize(ty, x).unwrap();
        let mut buf = vec![0u8; whole.len()];
        quantize_row(ty, x, &mut buf).unwrap();
        assert_eq!(buf, whole, "{ty}");
        let mut y = vec![0f32; x.len()];
        dequantize_row(ty, &buf, &mut y).unwrap();
        assert_eq!(y, dequantize(ty, &whole).unwrap(), "{ty}");
    }
}

/// Not a benchmark, just a guard against gratuitous slowness: 1M elements each way.
#[test]
fn a_million_elements_is_quick() {
    let x: Vec<f32> = (0..1u64 << 20)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    for ty in TYPES {
        let t = std::time::Instant::now();
        let q = quantize(ty, &x).unwrap();
        let y = dequantize(ty, &q).unwrap();
        let dt = t.elapsed();
        assert_eq!(y.len(), x.len());
        // Generous: debug builds and slow CI machines run this too.
        assert!(dt.as_secs_f64() < 20.0, "{ty}: {dt:?}");
        println!("{ty}: {dt:?}");
    }
}
