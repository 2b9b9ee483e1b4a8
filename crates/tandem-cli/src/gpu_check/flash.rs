//! The prefill attention kernel (`tandem_cuda::flash`) against an f64 softmax on the host: fresh
//! random queries, keys and values, each head size the kernel is built for, grouped KV heads, a
//! window, chunks that start after a prefix and end mid-tile; the output poisoned with NaN first.

use anyhow::Result;
use half::f16;
use tandem_cuda::flash::{flash_attention_into, key_range, key_tile, plan, FlashShape};
use tandem_cuda::Gpu;

use super::{rel_err, Rng, Row};

/// One case: head size, query and KV heads, chunk rows, keys before the chunk, window.
struct Case {
    head_dim: usize,
    n_head: usize,
    n_kv_head: usize,
    t: usize,
    prefix: usize,
    window: Option<usize>,
}

/// Rounding P to f16 before the V product costs about 2^-11 per weight; summed over random values the
/// relative error stays far below this bound, which a wrong mask or a dropped tile exceeds by orders.
const BOUND: f64 = 2e-3;

pub(super) fn flash_checks(gpu: &Gpu, rng: &mut Rng, table: &mut Vec<Row>) -> Result<()> {
    let cases = [
        Case {
            head_dim: 128,
            n_head: 8,
            n_kv_head: 2,
            t: 200,
            prefix: 77,
            window: None,
        },
        Case {
            head_dim: 128,
            n_head: 4,
            n_kv_head: 4,
            t: 512,
            prefix: 0,
            window: Some(100),
        },
        Case {
            head_dim: 256,
            n_head: 4,
            n_kv_head: 1,
            t: 300,
            prefix: 600,
            window: Some(512),
        },
        Case {
            head_dim: 64,
            n_head: 9,
            n_kv_head: 3,
            t: 129,
            prefix: 5,
            window: None,
        },
        Case {
            head_dim: 32,
            n_head: 2,
            n_kv_head: 1,
            t: 70,
            prefix: 0,
            window: Some(9),
        },
    ];
    for c in cases {
        let positions: Vec<usize> = (c.prefix..c.prefix + c.t).collect();
        let capacity = c.prefix + c.t;
        let keys = key_range(&positions, c.window, (capacity, 0, 0)).expect("a global buffer is contiguous");
        let (qw, kvw) = (c.n_head * c.head_dim, c.n_kv_head * c.head_dim);
        let scale = 1.0 / (c.head_dim as f32).sqrt();
        let q: Vec<f32> = (0..c.t * qw).map(|_| rng.normal()).collect();
        let k16: Vec<f16> = (0..capacity * kvw).map(|_| f16::from_f32(rng.normal())).collect();
        let v16: Vec<f16> = (0..capacity * kvw).map(|_| f16::from_f32(rng.normal())).collect();
        let reference = reference(&c, &positions, &q, &k16, &v16, scale);

        let bits = |v: &[f16]| v.iter().map(|h| h.to_bits()).collect::<Vec<u16>>();
        let (q_dev, k_dev, v_dev) = (gpu.upload(&q)?, gpu.upload(&bits(&k16))?, gpu.upload(&bits(&v16))?);
        let pos: Vec<i32> = positions.iter().map(|&p| p as i32).collect();
        let pos_dev = gpu.upload(&pos)?;
        let plan_dev = gpu.upload(&plan(&positions, c.window, keys, key_tile(c.head_dim)))?;
        let mut out = gpu.upload(&vec![f32::NAN; c.t * qw])?;
        let key_rows = keys.phys * kvw..(keys.phys + keys.n) * kvw;
        let shape = FlashShape {
            t: c.t,
            keys,
            window: c.window,
            n_head: c.n_head,
            n_kv_head: c.n_kv_head,
            head_dim: c.head_dim,
            scale,
        };
        flash_attention_into(
            gpu,
            shape,
            &q_dev.as_view(),
            &k_dev.slice(key_rows.clone()),
            &v_dev.slice(key_rows),
            &pos_dev.as_view(),
            &plan_dev.as_view(),
            &mut out.as_view_mut(),
        )?;
        let err = rel_err(&gpu.download(&out)?, &reference);
        table.push(Row {
            check: format!(
                "flash attention d{} {}/{} heads, {} queries after {}, window {:?}",
                c.head_dim, c.n_head, c.n_kv_head, c.t, c.prefix, c.window
            ),
            result: format!("rel err {err:.2e} (bound {BOUND:.0e})"),
            pass: err < BOUND,
        });
    }
    Ok(())
}

/// Softmax attention in f64 over the keys each query sees, its query rounded to f16 as the kernel's.
fn reference(c: &Case, positions: &[usize], q: &[f32], k: &[f16], v: &[f16], scale: f32) -> Vec<f64> {
    let (hd, qw, kvw) = (c.head_dim, c.n_head * c.head_dim, c.n_kv_head * c.head_dim);
    let group = c.n_head / c.n_kv_head;
    let mut out = vec![0f64; c.t * qw];
    for (r, &p) in positions.iter().enumerate() {
        let first = c.window.map_or(0, |w| (p + 1).saturating_sub(w));
        for h in 0..c.n_head {
            let qh: Vec<f64> = q[r * qw + h * hd..][..hd]
                .iter()
                .map(|&x| f16::from_f32(x).to_f64())
                .collect();
            let col = (h / group) * hd;
            let scores: Vec<f64> = (first..=p)
                .map(|j| {
                    let kr = &k[j * kvw + col..][..hd];
                    qh.iter().zip(kr).map(|(a, b)| a * b.to_f64()).sum::<f64>() * scale as f64
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let sum: f64 = w.iter().sum();
            for d in 0..hd {
                out[r * qw + h * hd + d] = (first..=p)
                    .zip(&w)
                    .map(|(j, wj)| wj * v[j * kvw + col + d].to_f64())
                    .sum::<f64>()
                    / sum;
            }
        }
    }
    out
}
