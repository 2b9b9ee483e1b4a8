//! The mixture-of-experts kernels against the host: `moe_route` must choose the experts
//! `Routing::from_logits` chooses on the same logits, slot for slot (ties to the lower index, NaN
//! rows included), with weights within a few roundings; `moe_combine` must give the bits of the
//! slot-order f32 sum of separately rounded products.

use anyhow::{ensure, Result};
use tandem_cuda::lab::ops::moe::{combine_into, route_into, RouteShape};
use tandem_cuda::Gpu;
use tandem_model::config::MoeConfig;
use tandem_model::moe::Routing;

use crate::common::{bits_equal, Rng, Row};

#[test]
fn moe_kernels_against_the_host() {
    crate::common::run("mixture kernel checks", moe_checks);
}

/// Weights are probabilities (at most 1): the device's `expf` and the host's differ by an ulp or two.
const WEIGHT_BOUND: f32 = 1e-6;

/// Logits of one of a few kinds: normal (rarely a tie), small integers (ties everywhere, equal
/// probabilities on both sides), and rows with a NaN, -inf or all equal.
fn logits(rng: &mut Rng, kind: usize, rows: usize, n: usize) -> Vec<f32> {
    (0..rows * n)
        .map(|i| match kind {
            0 => rng.normal() * 2.0,
            1 => (rng.next() % 5) as f32 - 2.0,
            _ => match (i / n) % 4 {
                0 => 0.5,
                1 if i % n == 3 => f32::NAN,
                2 if i % 3 == 0 => f32::NEG_INFINITY,
                _ => (rng.next() % 3) as f32,
            },
        })
        .collect()
}

fn moe_checks(gpu: &Gpu, rng: &mut Rng, table: &mut Vec<Row>) -> Result<()> {
    // (experts, used, renormalised): qwen3-moe-tiny, Qwen3-30B-A3B, small ones without the renorm.
    for (n, k, norm) in [
        (16, 4, true),
        (128, 8, true),
        (8, 2, false),
        (64, 6, true),
        (4, 4, true),
    ] {
        for kind in 0..3 {
            let rows = 37;
            let x = logits(rng, kind, rows, n);
            let moe = MoeConfig {
                n_expert: n,
                n_expert_used: k,
                d_ff_expert: 32,
                norm_weights: norm,
            };
            let host = Routing::from_logits(&x, &moe)?;
            let x_dev = gpu.upload(&x)?;
            let mut ids = gpu.upload(&vec![-1i32; rows * k])?;
            let mut w = gpu.upload(&vec![f32::NAN; rows * k])?;
            let shape = RouteShape { rows, n, k, norm };
            route_into(gpu, &x_dev, shape, &mut ids, &mut w)?;
            let ids = gpu.download(&ids)?;
            let w = gpu.download(&w)?;
            let same_ids = ids.iter().zip(&host.experts).all(|(&a, &b)| a >= 0 && a as u32 == b);
            // NaN rows give NaN weights on both sides.
            let worst = w
                .iter()
                .zip(&host.weights)
                .filter(|(a, b)| !(a.is_nan() && b.is_nan()))
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, |m, d| if d.is_nan() { f32::INFINITY } else { m.max(d) });
            table.push(Row {
                check: format!(
                    "moe_route {rows} rows, {k} of {n}{}, {} logits",
                    if norm { " renormalised" } else { "" },
                    ["normal", "small-integer (ties)", "NaN, -inf and equal"][kind]
                ),
                result: format!(
                    "experts {}; max weight diff {worst:.1e} (bound {WEIGHT_BOUND:.0e})",
                    if same_ids { "as the host's" } else { "DIFFERENT" }
                ),
                pass: same_ids && worst <= WEIGHT_BOUND,
            });
        }
    }
    // Combine: the stack of expert outputs in a shuffled order, as the grouping leaves it.
    for (rows, k, width) in [(1, 8, 2048), (37, 4, 256), (300, 8, 2048)] {
        let pairs = rows * k;
        let out_rows: Vec<f32> = (0..pairs * width).map(|_| rng.normal()).collect();
        let mut pos: Vec<i32> = (0..pairs as i32).collect();
        for i in (1..pairs).rev() {
            pos.swap(i, (rng.next() % (i as u64 + 1)) as usize);
        }
        let weights: Vec<f32> = (0..pairs).map(|_| rng.normal().abs() * 0.3).collect();
        let mut want = vec![0f32; rows * width];
        for r in 0..rows {
            for i in 0..width {
                let mut acc = 0f32;
                for s in 0..k {
                    let p = r * k + s;
                    let v = weights[p] * out_rows[pos[p] as usize * width + i];
                    acc = if s == 0 { v } else { acc + v };
                }
                want[r * width + i] = acc;
            }
        }
        let src = gpu.upload(&out_rows)?;
        let pos_dev = gpu.upload(&pos)?;
        let w_dev = gpu.upload(&weights)?;
        let mut out = gpu.upload(&vec![f32::NAN; rows * width])?;
        combine_into(gpu, &src, &pos_dev.as_view(), &w_dev, rows, k, width, &mut out)?;
        let got = gpu.download(&out)?;
        ensure!(got.len() == want.len(), "moe_combine: {} outputs", got.len());
        let same = bits_equal(&got, &want);
        table.push(Row {
            check: format!("moe_combine {rows} rows of {width}, {k} slots"),
            result: if same {
                "bit-identical to the host's slot-order sum".into()
            } else {
                "DIFFERENT".into()
            },
            pass: same,
        });
    }
    Ok(())
}
