//! Matrix-multiply benchmark on the weight shapes of Gemma 3 270M and SmolLM2 135M.
//!
//! `cargo run --release -p tandem-backend --example matmul_bench [-- --threads N --isa NAME --runs N]`
//!
//! For each shape: decode (t = 1) time and weight bytes streamed per second, both "hot" (the same
//! weights every call, cache-resident when small) and "cold" (cycling through copies totalling
//! over 128 MiB, so weights come from DRAM as in a real decode step); prefill (t = 512) time and
//! GFLOP/s (2·rows·cols·t per call). Medians of several runs. A plain read (sum) and memcpy of
//! a large buffer give the machine's memory bandwidth for reference.

use std::time::Instant;

use tandem_backend::{matmul, GgmlType, Isa, ThreadPool, WeightMatrix};

struct Shape {
    model: &'static str,
    ty: GgmlType,
    cols: usize,
    rows: usize,
    prefill: bool,
}

const fn s(model: &'static str, ty: GgmlType, cols: usize, rows: usize, prefill: bool) -> Shape {
    Shape {
        model,
        ty,
        cols,
        rows,
        prefill,
    }
}

const SHAPES: &[Shape] = &[
    s("gemma3-270m", GgmlType::Q5_0, 640, 1024, true),
    s("gemma3-270m", GgmlType::Q5_0, 640, 256, true),
    s("gemma3-270m", GgmlType::Q8_0, 640, 256, true),
    s("gemma3-270m", GgmlType::Q4_K, 1024, 640, true),
    s("gemma3-270m", GgmlType::Q5_0, 640, 2048, true),
    s("gemma3-270m", GgmlType::Q6_K, 2048, 640, true),
    s("gemma3-270m", GgmlType::Q8_0, 640, 262144, false),
    s("smollm2-135m", GgmlType::Q4_1, 576, 576, true),
    s("smollm2-135m", GgmlType::Q4_1, 576, 192, true),
    s("smollm2-135m", GgmlType::Q4_1, 576, 1536, true),
    s("smollm2-135m", GgmlType::Q4_1, 1536, 576, true),
    s("smollm2-135m", GgmlType::Q8_0, 576, 49152, false),
];

/// SplitMix64, for weight bytes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Random block bytes with small finite f16 scales (speed does not depend on the values).
fn weights(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let n = rows * cols / ty.block_elems() * ty.block_bytes();
    let mut b: Vec<u8> = (0..n.div_ceil(8))
        .flat_map(|_| rng.next().to_le_bytes())
        .take(n)
        .collect();
    let scales: &[usize] = match ty {
        GgmlType::Q4_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        _ => &[0],
    };
    let d = half::f16::from_f32(0.001).to_le_bytes();
    for blk in b.chunks_exact_mut(ty.block_bytes()) {
        for &o in scales {
            blk[o..o + 2].copy_from_slice(&d);
        }
    }
    b
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Median seconds of `f` over `runs` batches of calls lasting at least `min_batch` seconds each.
fn time(runs: usize, min_batch: f64, mut f: impl FnMut()) -> f64 {
    f();
    let t0 = Instant::now();
    f();
    let once = t0.elapsed().as_secs_f64().max(1e-7);
    let reps = ((min_batch / once).ceil() as usize).max(1);
    median(
        (0..runs)
            .map(|_| {
                let t0 = Instant::now();
                for _ in 0..reps {
                    f();
                }
                t0.elapsed().as_secs_f64() / reps as f64
            })
            .collect(),
    )
}

fn memory_bandwidth(pool: &ThreadPool, runs: usize) -> (f64, f64) {
    let n = 256 << 20;
    let src: Vec<u64> = (0..n / 8).map(|i| i as u64).collect();
    let mut dst = vec![0u64; n / 8];
    let threads = pool.n_threads();
    let chunk = src.len().div_ceil(threads);
    let sums: Vec<std::sync::atomic::AtomicU64> = (0..threads).map(|_| 0.into()).collect();
    let read = time(runs, 0.0, || {
        pool.run(threads, &|t| {
            let s: u64 = src[t * chunk..((t + 1) * chunk).min(src.len())]
                .iter()
                .fold(0, |a, &b| a.wrapping_add(b));
            sums[t].store(s, std::sync::atomic::Ordering::Relaxed);
        })
    });
    let copy = time(runs, 0.0, || {
        let dst_chunks: Vec<std::sync::Mutex<&mut [u64]>> = dst.chunks_mut(chunk).map(std::sync::Mutex::new).collect();
        pool.run(threads, &|t| {
            dst_chunks[t]
                .lock()
                .unwrap()
                .copy_from_slice(&src[t * chunk..((t + 1) * chunk).min(src.len())]);
        })
    });
    (n as f64 / read / 1e9, 2.0 * n as f64 / copy / 1e9)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let threads: usize = arg("--threads").map_or(2, |v| v.parse().expect("--threads N"));
    let runs: usize = arg("--runs").map_or(7, |v| v.parse().expect("--runs N"));
    let isa = match arg("--isa").as_deref() {
        None => Isa::detect(),
        Some("scalar") => Isa::Scalar,
        Some("avx2") => Isa::Avx2,
        Some("avx512") => Isa::Avx512,
        Some(o) => panic!("unknown --isa {o} (scalar, avx2, avx512)"),
    };
    let only: Option<String> = arg("--only");
    let pool = ThreadPool::with_isa(threads, isa);
    println!(
        "tandem-backend matmul bench: {} threads, kernels {}",
        pool.n_threads(),
        pool.isa().name()
    );
    let (read, copy) = memory_bandwidth(&pool, runs);
    println!("memory: read (sum) {read:.1} GB/s, memcpy {copy:.1} GB/s (read + write bytes)\n");
    println!(
        "{:<13} {:<5} {:>12} | {:>9} {:>8} | {:>9} {:>8} | {:>9} {:>8}",
        "model", "type", "in->out", "t=1 hot", "GB/s", "t=1 cold", "GB/s", "t=512", "GFLOP/s"
    );
    let mut rng = Rng(42);
    for sh in SHAPES {
        if only.as_deref().is_some_and(|o| !sh.ty.name().eq_ignore_ascii_case(o)) {
            continue;
        }
        let data = weights(sh.ty, sh.rows, sh.cols, &mut rng);
        let bytes = data.len() as f64;
        let w = WeightMatrix {
            ty: sh.ty,
            data: &data,
            rows: sh.rows,
            cols: sh.cols,
        };
        let x: Vec<f32> = (0..512 * sh.cols)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 300.0)
            .collect();
        let mut out = vec![0f32; 512 * sh.rows];

        let hot = time(runs, 0.05, || {
            matmul(&pool, &w, &x[..sh.cols], 1, &mut out[..sh.rows]).unwrap()
        });
        // Enough copies that the set exceeds the last-level cache several times over.
        let copies = ((128 << 20) as f64 / bytes).ceil() as usize;
        let cold = if copies > 1 {
            let all: Vec<Vec<u8>> = (0..copies).map(|_| data.clone()).collect();
            let mut i = 0;
            time(runs, 0.05, || {
                let w = WeightMatrix {
                    data: &all[i % copies],
                    ..w
                };
                i += 1;
                matmul(&pool, &w, &x[..sh.cols], 1, &mut out[..sh.rows]).unwrap()
            })
        } else {
            hot
        };
        let pre = sh
            .prefill
            .then(|| time(runs.min(5), 0.2, || matmul(&pool, &w, &x, 512, &mut out).unwrap()));
        let (pre_s, gflops) = match pre {
            Some(p) => (
                format!("{:.2} ms", p * 1e3),
                format!("{:.1}", 2.0 * (sh.rows * sh.cols * 512) as f64 / p / 1e9),
            ),
            None => ("-".into(), "-".into()),
        };
        println!(
            "{:<13} {:<5} {:>12} | {:>6.1} us {:>8.1} | {:>6.1} us {:>8.1} | {:>9} {:>8}",
            sh.model,
            sh.ty.name(),
            format!("{}->{}", sh.cols, sh.rows),
            hot * 1e6,
            bytes / hot / 1e9,
            cold * 1e6,
            bytes / cold / 1e9,
            pre_s,
            gflops
        );
    }
}
