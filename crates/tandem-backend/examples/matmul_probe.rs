//! Profiling harness: one shape, many calls, best of 5 batches (for `perf record`).
//!
//! `cargo run --release -p tandem-backend --example matmul_probe -- TYPE COLS ROWS [T [THREADS [ITERS]]]`
//! With `COLD=1` in the environment the weights cycle through copies totalling over 256 MiB;
//! `ISA=avx2` or `ISA=scalar` picks a lower instruction set.
use std::time::Instant;
use tandem_backend::{matmul, GgmlType, ThreadPool, WeightMatrix};
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let ty = GgmlType::from_name(&a[1]).unwrap();
    let cols: usize = a[2].parse().unwrap();
    let rows: usize = a[3].parse().unwrap();
    let t: usize = a.get(4).map_or(1, |v| v.parse().unwrap());
    let threads: usize = a.get(5).map_or(1, |v| v.parse().unwrap());
    let iters: usize = a.get(6).map_or(2000, |v| v.parse().unwrap());
    let n = rows * cols / ty.block_elems() * ty.block_bytes();
    let mut data = vec![0u8; n];
    for (i, b) in data.iter_mut().enumerate() {
        *b = (i * 7 % 251) as u8;
    }
    for blk in data.chunks_exact_mut(ty.block_bytes()) {
        blk[0] = 0;
        blk[1] = 0x1c;
    }
    let copies = if std::env::var("COLD").is_ok() {
        (256 << 20) / n + 1
    } else {
        1
    };
    let all: Vec<Vec<u8>> = (0..copies).map(|_| data.clone()).collect();
    let mut ci = 0;
    let x: Vec<f32> = (0..cols * t).map(|i| (i as f32).sin()).collect();
    let mut out = vec![0f32; rows * t];
    let isa = match std::env::var("ISA").as_deref() {
        Ok("scalar") => tandem_backend::Isa::Scalar,
        Ok("avx2") => tandem_backend::Isa::Avx2,
        _ => tandem_backend::Isa::detect(),
    };
    let pool = ThreadPool::with_isa(threads, isa);
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t0 = Instant::now();
        for _ in 0..iters {
            let w = WeightMatrix {
                ty,
                data: &all[ci % copies],
                rows,
                cols,
            };
            ci += 1;
            matmul(&pool, &w, &x, t, &mut out).unwrap();
        }
        best = best.min(t0.elapsed().as_secs_f64() / iters as f64);
    }
    println!(
        "{ty} {cols}->{rows} t={t}: {:.2} us, {:.1} GB/s, {:.1} GFLOP/s",
        best * 1e6,
        n as f64 / best / 1e9,
        2.0 * (rows * cols * t) as f64 / best / 1e9
    );
}
