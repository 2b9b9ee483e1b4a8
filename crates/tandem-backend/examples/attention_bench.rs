//! Times CPU attention over a long f16 cache, as a decode step (one query row) and as prefill chunks, on
//! the two real models' head shapes, and prints a hash of the output bits so a faster kernel can be
//! checked for the same results.
//!
//! `cargo run --release -p tandem-backend --example attention_bench [-- THREADS]`

use std::hash::{Hash, Hasher};
use std::time::Instant;

use half::f16;
use tandem_backend::cpu::attention::{attend, AttentionShape, KvRows};
use tandem_backend::ThreadPool;

struct Dense {
    k: Vec<f16>,
    v: Vec<f16>,
    width: usize,
}

impl KvRows for Dense {
    fn k_rows(&self, pos: usize) -> &[f16] {
        &self.k[pos * self.width..]
    }
    fn v_rows(&self, pos: usize) -> &[f16] {
        &self.v[pos * self.width..]
    }
}

fn values(n: usize, seed: u64, amplitude: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * amplitude
        })
        .collect()
}

fn main() {
    let threads: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(2);
    let pool = ThreadPool::new(threads);
    let shapes = [
        ("smollm2 (9 heads, 3 kv, 64)", 9, 3, 64),
        ("gemma3 global (4 heads, 1 kv, 256)", 4, 1, 256),
    ];
    println!("| shape | test | depth | µs a call | output hash |");
    println!("|---|---|---:|---:|---|");
    for (name, n_head, n_kv_head, head_dim) in shapes {
        let shape = AttentionShape {
            n_head,
            n_kv_head,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
            window: None,
        };
        for depth in [1024usize, 4096] {
            let rows = 512;
            let width = n_kv_head * head_dim;
            let n_pos = depth + rows;
            let kv = Dense {
                k: values(n_pos * width, 1, 2.0).into_iter().map(f16::from_f32).collect(),
                v: values(n_pos * width, 2, 1.0).into_iter().map(f16::from_f32).collect(),
                width,
            };
            for (test, t) in [("decode", 1usize), ("chunk 64", 64), ("chunk 512", 512)] {
                let qw = n_head * head_dim;
                let q = values(t * qw, 3, 1.5);
                let positions: Vec<usize> = (depth..depth + t).collect();
                let mut out = vec![0f32; t * qw];
                let reps = (200_000 / (depth * t)).clamp(2, 200);
                attend(&pool, &q, &positions, &kv, &shape, &mut out);
                let start = Instant::now();
                for _ in 0..reps {
                    attend(&pool, &q, &positions, &kv, &shape, &mut out);
                }
                let us = start.elapsed().as_secs_f64() * 1e6 / reps as f64;
                let mut h = std::collections::hash_map::DefaultHasher::new();
                out.iter().for_each(|x| x.to_bits().hash(&mut h));
                println!("| {name} | {test} | {depth} | {us:.1} | {:016x} |", h.finish());
            }
        }
    }
}
