//! The mixture-of-experts kernels against the host: `moe_route` must choose the experts
//! `Routing::from_logits` chooses on the same logits, slot for slot (ties to the lower index, NaN
//! rows included), with weights within a few roundings; `moe_combine` must give the bits of the
//! slot-order f32 sum of separately rounded products; the expert products by ids on the device
//! (`mmvq_ids_*`, `moe_sort` + `mmq_ids_*`) must give each expert's own launch's bits.

use anyhow::{ensure, Context, Result};
use tandem_cuda::lab::launch::type_suffix;
use tandem_cuda::lab::matmul::indexed::{mmq_ids_into, mmvq_ids_into, ExpertTable, Pairs};
use tandem_cuda::lab::matmul::int8::{int8_format, mmvq_into, quantize_act_into, repack, variants};
use tandem_cuda::lab::ops::moe::{
    combine_into, max_sort_tiles, route_into, sort_into, RouteShape, SortedPairs, SORT_TILE,
};
use tandem_cuda::Gpu;
use tandem_gguf::GgmlType;
use tandem_model::config::MoeConfig;
use tandem_model::moe::{group_by_expert, Routing};

use crate::common::{bits_equal, host_weights, Rng, Row};

#[test]
fn moe_kernels_against_the_host() {
    crate::common::run("mixture kernel checks", moe_checks);
}

#[test]
fn indexed_experts_equal_each_experts_own_launch() {
    crate::common::run("indexed expert checks", indexed_checks);
}

#[test]
fn sorted_experts_equal_each_experts_own_launch() {
    crate::common::run("sorted expert checks", sorted_checks);
}

/// A chunk's pairs sorted by expert on the device (`moe_sort`): the host grouping's order
/// (`group_by_expert`, stacked group after group), each expert's tiles of up to `SORT_TILE`; then the
/// grouped tensor-core products over those tiles (`mmq_ids_*`), one table and two in a launch: each
/// output row has the bits of its expert's one-row split-1 launch on that row alone.
fn sorted_checks(gpu: &Gpu, rng: &mut Rng, table: &mut Vec<Row>) -> Result<()> {
    let (n_expert, rows, k, a_rows) = (7, 64, 3, 45);
    for (ty, cols) in [(GgmlType::Q4_K, 768), (GgmlType::Q6_K, 512), (GgmlType::Q8_0, 96)] {
        let fmt = int8_format(ty).context("an integer type")?;
        let suffix = type_suffix(ty).context("type has kernels")?;
        let split1 = variants(suffix)
            .into_iter()
            .find(|v| v.split == 1 && !v.staged)
            .context("a split-1 variant")?;
        let mut experts = Vec::new();
        for _ in 0..2 * n_expert {
            let w = gpu.upload(&host_weights(rng, ty, rows, cols)?)?;
            experts.push(repack(gpu, ty, &w, rows, cols)?.unwrap_or(w));
        }
        let (gate, up) = experts.split_at(n_expert);
        // Skewed: expert 0 takes more than two tiles, expert 6 none.
        let ids: Vec<i32> = (0..a_rows * k)
            .map(|p| {
                if p % 3 == 0 {
                    0
                } else {
                    (rng.next() % (n_expert as u64 - 1)) as i32
                }
            })
            .collect();
        let pairs = ids.len();
        let max_tiles = max_sort_tiles(pairs, n_expert);
        let mut src_row = gpu.upload(&vec![-1i32; pairs])?;
        let mut pos = gpu.upload(&vec![-1i32; pairs])?;
        let mut tiles = gpu.upload(&vec![-1i32; 1 + 3 * max_tiles])?;
        let out = SortedPairs {
            src_row: &mut src_row,
            pos: &mut pos,
            tiles: &mut tiles,
        };
        sort_into(gpu, &gpu.upload(&ids)?, a_rows, n_expert, k, out)?;
        let (src_row, pos, tiles) = (gpu.download(&src_row)?, gpu.download(&pos)?, gpu.download(&tiles)?);
        // The host's order and tiles.
        let chosen: Vec<u32> = ids.iter().map(|&e| e as u32).collect();
        let (mut want_src, mut want_pos, mut want_tiles) = (Vec::new(), vec![0i32; pairs], vec![0i32]);
        for g in group_by_expert(&chosen, n_expert) {
            let first = want_src.len();
            for &p in &g.pairs {
                want_pos[p] = want_src.len() as i32;
                want_src.push((p / k) as i32);
            }
            let end = want_src.len();
            for s in (first..end).step_by(SORT_TILE) {
                want_tiles.extend([g.expert as i32, s as i32, end as i32]);
                want_tiles[0] += 1;
            }
        }
        let sorted_ok = src_row == want_src && pos == want_pos && tiles[..want_tiles.len()] == want_tiles[..];
        table.push(Row {
            check: format!("moe_sort {pairs} pairs of {n_expert} experts ({ty} case)"),
            result: if sorted_ok {
                format!("the host grouping's order, {} tiles", want_tiles[0])
            } else {
                "DIFFERENT".into()
            },
            pass: sorted_ok,
        });
        // The chunk's activations, the sorted pairs' rows quantized once, and each row alone.
        let x: Vec<f32> = (0..a_rows * cols).map(|_| rng.normal()).collect();
        let xs: Vec<f32> = want_src
            .iter()
            .flat_map(|&t| x[t as usize * cols..][..cols].to_vec())
            .collect();
        let mut a = gpu.alloc::<u8>(fmt.bytes(pairs, cols))?;
        quantize_act_into(gpu, fmt, &gpu.upload(&xs)?, pairs, cols, &mut a)?;
        let mut lone = Vec::new();
        for t in 0..a_rows {
            let mut at = gpu.alloc::<u8>(fmt.bytes(1, cols))?;
            quantize_act_into(gpu, fmt, &gpu.upload(&x[t * cols..(t + 1) * cols])?, 1, cols, &mut at)?;
            lone.push(at);
        }
        let (gate_refs, up_refs): (Vec<_>, Vec<_>) = (gate.iter().collect(), up.iter().collect());
        let gate_t = ExpertTable::new(gpu, &gate_refs, suffix, fmt, split1, rows, cols)?;
        let up_t = ExpertTable::new(gpu, &up_refs, suffix, fmt, split1, rows, cols)?;
        let tiles_dev = gpu.upload(&tiles)?;
        let (mut equal, mut cases) = (true, Vec::new());
        for both in [false, true] {
            let mut y0 = gpu.upload(&vec![f32::NAN; pairs * rows])?;
            let mut y1 = gpu.upload(&vec![f32::NAN; pairs * rows])?;
            if both {
                mmq_ids_into(
                    gpu,
                    &[&gate_t, &up_t],
                    &tiles_dev,
                    max_tiles,
                    &a,
                    pairs,
                    &mut [&mut y0, &mut y1],
                )?;
            } else {
                mmq_ids_into(gpu, &[&gate_t], &tiles_dev, max_tiles, &a, pairs, &mut [&mut y0])?;
            }
            let got = [gpu.download(&y0)?, gpu.download(&y1)?];
            for (p, &e) in ids.iter().enumerate() {
                let s = want_pos[p] as usize;
                for (m, set) in [gate, up].iter().enumerate().take(if both { 2 } else { 1 }) {
                    let row = &got[m][s * rows..(s + 1) * rows];
                    let mut want = gpu.upload(&vec![f32::NAN; rows])?;
                    mmvq_into(
                        gpu,
                        suffix,
                        split1,
                        &set[e as usize],
                        &lone[p / k],
                        1,
                        rows,
                        cols,
                        &mut want,
                    )?;
                    let want = gpu.download(&want)?;
                    if !bits_equal(row, &want) || row.iter().any(|v| !v.is_finite()) {
                        equal = false;
                        cases.push(format!("pair {p} (expert {e}, position {s}) matrix {m}"));
                    }
                }
            }
        }
        cases.truncate(6);
        table.push(Row {
            check: format!(
                "sorted experts ({ty}, {n_expert} experts of {rows}x{cols}, {pairs} pairs, one and two tables) = each expert's own split-1 launch"
            ),
            result: if equal { "bit-equal".into() } else { cases.join("; ") },
            pass: equal,
        });
    }
    Ok(())
}

/// The routed experts' products by ids on the device (`mmvq_ids_*`, a mixture's decode): for every
/// variant of each integer type, each pair's row has the bits of its expert's own one-row launch of
/// that variant, alone (the down projection: a pair a row) and two tables in one launch (gate and
/// up: a row read by its k pairs); an id outside the table leaves its row as it was.
fn indexed_checks(gpu: &Gpu, rng: &mut Rng, table: &mut Vec<Row>) -> Result<()> {
    let (n_expert, rows, k, a_rows) = (6, 64, 3, 2);
    for (ty, cols) in [(GgmlType::Q4_K, 768), (GgmlType::Q6_K, 512), (GgmlType::Q8_0, 96)] {
        let fmt = int8_format(ty).context("an integer type")?;
        let suffix = type_suffix(ty).context("type has kernels")?;
        let mut experts = Vec::new();
        for _ in 0..2 * n_expert {
            let w = gpu.upload(&host_weights(rng, ty, rows, cols)?)?;
            experts.push(repack(gpu, ty, &w, rows, cols)?.unwrap_or(w));
        }
        let (gate, up) = experts.split_at(n_expert);
        let x: Vec<f32> = (0..a_rows * cols).map(|_| rng.normal()).collect();
        let mut a = gpu.alloc::<u8>(fmt.bytes(a_rows, cols))?;
        quantize_act_into(gpu, fmt, &gpu.upload(&x)?, a_rows, cols, &mut a)?;
        // Each activation row alone, as a decode step quantizes it.
        let mut lone = Vec::new();
        for t in 0..a_rows {
            let mut at = gpu.alloc::<u8>(fmt.bytes(1, cols))?;
            quantize_act_into(gpu, fmt, &gpu.upload(&x[t * cols..(t + 1) * cols])?, 1, cols, &mut at)?;
            lone.push(at);
        }
        // Expert 5 twice, an id past the table last: its rows must stay NaN.
        let mut ids: Vec<i32> = (0..a_rows * k - 1)
            .map(|_| (rng.next() % n_expert as u64) as i32)
            .collect();
        ids[1] = 5;
        ids[2] = 5;
        ids.push(n_expert as i32);
        let pairs = ids.len();
        let ids_dev = gpu.upload(&ids)?;
        // A pair a row (the down projection) reads a row of its own: the rows repeated for the pairs.
        let xs: Vec<f32> = (0..pairs)
            .flat_map(|p| x[(p % a_rows) * cols..][..cols].to_vec())
            .collect();
        let mut a_pairs = gpu.alloc::<u8>(fmt.bytes(pairs, cols))?;
        quantize_act_into(gpu, fmt, &gpu.upload(&xs)?, pairs, cols, &mut a_pairs)?;
        let (gate_refs, up_refs): (Vec<_>, Vec<_>) = (gate.iter().collect(), up.iter().collect());
        let (mut equal, mut cases) = (true, Vec::new());
        for v in variants(suffix) {
            let gate_t = ExpertTable::new(gpu, &gate_refs, suffix, fmt, v, rows, cols)?;
            let up_t = ExpertTable::new(gpu, &up_refs, suffix, fmt, v, rows, cols)?;
            for (a_div, both) in [(1, false), (k, true)] {
                let mut y0 = gpu.upload(&vec![f32::NAN; pairs * rows])?;
                let mut y1 = gpu.upload(&vec![f32::NAN; pairs * rows])?;
                let src = match a_div {
                    1 => Pairs {
                        ids: &ids_dev,
                        pairs,
                        a: &a_pairs,
                        a_rows: pairs,
                        a_div,
                    },
                    _ => Pairs {
                        ids: &ids_dev,
                        pairs,
                        a: &a,
                        a_rows,
                        a_div,
                    },
                };
                if both {
                    mmvq_ids_into(gpu, &[&gate_t, &up_t], &src, &mut [&mut y0, &mut y1])?;
                } else {
                    mmvq_ids_into(gpu, &[&gate_t], &src, &mut [&mut y0])?;
                }
                let got = [gpu.download(&y0)?, gpu.download(&y1)?];
                for (p, &e) in ids.iter().enumerate() {
                    let t = if a_div == 1 { p % a_rows } else { p / a_div };
                    for (m, set) in [gate, up].iter().enumerate().take(if both { 2 } else { 1 }) {
                        let row = &got[m][p * rows..(p + 1) * rows];
                        let Some(w) = set.get(e as usize) else {
                            let kept = row.iter().all(|v| v.is_nan());
                            equal &= kept;
                            if !kept {
                                cases.push(format!("{} pair {p}: an id past the table wrote its row", v.label()));
                            }
                            continue;
                        };
                        let mut want = gpu.upload(&vec![f32::NAN; rows])?;
                        mmvq_into(gpu, suffix, v, w, &lone[t], 1, rows, cols, &mut want)?;
                        let want = gpu.download(&want)?;
                        if !bits_equal(row, &want) || row.iter().any(|v| !v.is_finite()) {
                            equal = false;
                            cases.push(format!("{} pair {p} matrix {m} (a pair each {a_div})", v.label()));
                        }
                    }
                }
            }
        }
        table.push(Row {
            check: format!(
                "indexed experts ({ty}, {n_expert} experts of {rows}x{cols}, every variant, one and two tables) = each expert's own launch"
            ),
            result: if equal { "bit-equal".into() } else { cases.join("; ") },
            pass: equal,
        });
    }
    Ok(())
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
        combine_into(gpu, &src, Some(&pos_dev.as_view()), &w_dev, rows, k, width, &mut out)?;
        let got = gpu.download(&out)?;
        ensure!(got.len() == want.len(), "moe_combine: {} outputs", got.len());
        let mut same = bits_equal(&got, &want);
        // Without positions, the stack is read in pair order: the same sums over the stack reordered.
        let mut in_order = vec![0f32; pairs * width];
        for (p, &at) in pos.iter().enumerate() {
            let at = at as usize;
            in_order[p * width..(p + 1) * width].copy_from_slice(&out_rows[at * width..(at + 1) * width]);
        }
        let mut out = gpu.upload(&vec![f32::NAN; rows * width])?;
        combine_into(gpu, &gpu.upload(&in_order)?, None, &w_dev, rows, k, width, &mut out)?;
        same &= bits_equal(&gpu.download(&out)?, &want);
        table.push(Row {
            check: format!("moe_combine {rows} rows of {width}, {k} slots"),
            result: if same {
                "bit-identical to the host's slot-order sum (by positions and in pair order)".into()
            } else {
                "DIFFERENT".into()
            },
            pass: same,
        });
    }
    Ok(())
}
