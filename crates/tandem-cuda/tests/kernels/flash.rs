//! The prefill attention kernel (`attention::flash`) against an f64 softmax on the host: fresh random
//! queries, keys and values, every compiled variant, grouped KV heads, windows, chunks that start
//! after a prefix and end mid-tile; the output poisoned with NaN first.

use anyhow::{Context, Result};
use half::f16;
use tandem_cuda::lab::attention::flash::{
    flash_attention_into, key_range, plan, FlashShape, FlashVariant, KeyRange, VARIANTS,
};
use tandem_cuda::{CudaSlice, Gpu};

use crate::common::{rel_err, Rng, Row};

#[test]
fn flash_attention_against_f64() {
    crate::common::run("flash attention checks", flash_checks);
}

/// One case: head size, query and KV heads, chunk rows, keys before the chunk, window.
struct Case {
    head_dim: usize,
    n_head: usize,
    n_kv_head: usize,
    t: usize,
    prefix: usize,
    window: Option<usize>,
}

impl Case {
    /// The softmax scale: 1 / sqrt(head size).
    fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }
}

/// Rounding P to f16 before the V product costs about 2^-11 per weight; summed over random values the
/// relative error stays far below this bound, which a wrong mask or a dropped tile exceeds by orders.
const BOUND: f64 = 2e-3;

pub(crate) fn flash_checks(gpu: &Gpu, rng: &mut Rng, table: &mut Vec<Row>) -> Result<()> {
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
        for v in VARIANTS
            .iter()
            .filter(|v| v.head_dim == c.head_dim && v.runs_on(gpu.major))
        {
            check_case(gpu, rng, &c, *v, table)?;
        }
    }
    Ok(())
}

/// Device copies of one case's inputs.
struct Inputs {
    positions: Vec<usize>,
    q: CudaSlice<f32>,
    k: CudaSlice<u16>,
    v: CudaSlice<u16>,
    pos: CudaSlice<i32>,
}

fn upload(gpu: &Gpu, c: &Case, q: &[f32], k16: &[f16], v16: &[f16]) -> Result<Inputs> {
    let positions: Vec<usize> = (c.prefix..c.prefix + c.t).collect();
    let bits = |v: &[f16]| v.iter().map(|h| h.to_bits()).collect::<Vec<u16>>();
    let pos: Vec<i32> = positions.iter().map(|&p| p as i32).collect();
    Ok(Inputs {
        q: gpu.upload(q)?,
        k: gpu.upload(&bits(k16))?,
        v: gpu.upload(&bits(v16))?,
        pos: gpu.upload(&pos)?,
        positions,
    })
}

/// The keys of case `c` (its buffer holds positions from 0) and variant `v`'s plan for them.
fn plan_for(gpu: &Gpu, c: &Case, v: FlashVariant, inp: &Inputs) -> Result<(KeyRange, CudaSlice<i32>)> {
    let keys = key_range(&inp.positions, c.window, (c.prefix + c.t, 0, 0))
        .context("flash check: the keys of a buffer holding every position wrap")?;
    let plan = plan(&inp.positions, c.window, keys, (v.query_tile(), v.key_tile));
    Ok((keys, gpu.upload(&plan)?))
}

/// Runs variant `v` on case `c` into `out`.
fn launch(
    gpu: &Gpu,
    c: &Case,
    v: FlashVariant,
    inp: &Inputs,
    (keys, plan_dev): &(KeyRange, CudaSlice<i32>),
    out: &mut CudaSlice<f32>,
) -> Result<()> {
    let keys = *keys;
    let kvw = c.n_kv_head * c.head_dim;
    let key_rows = keys.phys * kvw..(keys.phys + keys.n) * kvw;
    let shape = FlashShape {
        t: c.t,
        keys,
        window: c.window,
        n_head: c.n_head,
        n_kv_head: c.n_kv_head,
        head_dim: c.head_dim,
        scale: c.scale(),
    };
    flash_attention_into(
        gpu,
        v,
        shape,
        &inp.q.as_view(),
        &inp.k.slice(key_rows.clone()),
        &inp.v.slice(key_rows),
        &inp.pos.as_view(),
        &plan_dev.as_view(),
        &mut out.as_view_mut(),
    )?;
    Ok(())
}

fn random_inputs(rng: &mut Rng, c: &Case) -> (Vec<f32>, Vec<f16>, Vec<f16>) {
    let (qw, kvw) = (c.n_head * c.head_dim, c.n_kv_head * c.head_dim);
    let capacity = c.prefix + c.t;
    let q: Vec<f32> = (0..c.t * qw).map(|_| rng.normal()).collect();
    let k16: Vec<f16> = (0..capacity * kvw).map(|_| f16::from_f32(rng.normal())).collect();
    let v16: Vec<f16> = (0..capacity * kvw).map(|_| f16::from_f32(rng.normal())).collect();
    (q, k16, v16)
}

fn check_case(gpu: &Gpu, rng: &mut Rng, c: &Case, v: FlashVariant, table: &mut Vec<Row>) -> Result<()> {
    let (q, k16, v16) = random_inputs(rng, c);
    let inp = upload(gpu, c, &q, &k16, &v16)?;
    let reference = reference(c, &inp.positions, &q, &k16, &v16);
    let mut out = gpu.upload(&vec![f32::NAN; q.len()])?;
    launch(gpu, c, v, &inp, &plan_for(gpu, c, v, &inp)?, &mut out)?;
    let err = rel_err(&gpu.download(&out)?, &reference);
    table.push(Row {
        check: format!(
            "flash attention {} {}/{} heads, {} queries after {}, window {:?}",
            v.kernel(),
            c.n_head,
            c.n_kv_head,
            c.t,
            c.prefix,
            c.window
        ),
        result: format!("rel err {err:.2e} (bound {BOUND:.0e})"),
        pass: err < BOUND,
    });
    Ok(())
}

/// Softmax attention in f64 over the keys each query sees, its query rounded to f16 as the kernel's.
fn reference(c: &Case, positions: &[usize], q: &[f32], k: &[f16], v: &[f16]) -> Vec<f64> {
    let (hd, qw, kvw) = (c.head_dim, c.n_head * c.head_dim, c.n_kv_head * c.head_dim);
    let group = c.n_head / c.n_kv_head;
    let mut out = vec![0f64; c.t * qw];
    for (r, &p) in positions.iter().enumerate() {
        let first = c.window.map_or(0, |w| (p + 1).saturating_sub(w));
        for h in 0..c.n_head {
            let col = (h / group) * hd;
            let keys: Vec<usize> = (first..=p).map(|j| j * kvw + col).collect();
            let at = r * qw + h * hd;
            attend_f64(&q[at..at + hd], k, v, &keys, c.scale() as f64, &mut out[at..at + hd]);
        }
    }
    out
}

/// One query head's softmax attention in f64: `q` rounded to f16 (as the kernels round it), each
/// key's head at offset `keys[i]` of `k` and `v`, scores times `scale`; the head's output into `out`.
pub(crate) fn attend_f64(q: &[f32], k: &[f16], v: &[f16], keys: &[usize], scale: f64, out: &mut [f64]) {
    let qh: Vec<f64> = q.iter().map(|&x| f16::from_f32(x).to_f64()).collect();
    let scores: Vec<f64> = keys
        .iter()
        .map(|&at| {
            qh.iter()
                .zip(&k[at..at + qh.len()])
                .map(|(a, b)| a * b.to_f64())
                .sum::<f64>()
                * scale
        })
        .collect();
    let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
    let sum: f64 = w.iter().sum();
    for (d, o) in out.iter_mut().enumerate() {
        *o = keys
            .iter()
            .zip(&w)
            .map(|(&at, wj)| wj * v[at + d].to_f64())
            .sum::<f64>()
            / sum;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_f64_reference_weighs_keys_by_their_softmax() {
        let h = |x: &[f32]| x.iter().map(|&v| f16::from_f32(v)).collect::<Vec<f16>>();
        // Two keys of two dimensions at offsets 0 and 2; the query scores them 1 and 3 (scale 1).
        let (k, v) = (h(&[1.0, 0.0, 3.0, 0.0]), h(&[2.0, 4.0, 6.0, 8.0]));
        let mut out = [0f64; 2];
        attend_f64(&[1.0, 5.0], &k, &v, &[0, 2], 1.0, &mut out);
        let (w0, w1) = (1f64.exp(), 3f64.exp());
        let want = [(2.0 * w0 + 6.0 * w1) / (w0 + w1), (4.0 * w0 + 8.0 * w1) / (w0 + w1)];
        assert!(
            out.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-12),
            "{out:?} against {want:?}"
        );
        // One key: its value, whatever the score.
        attend_f64(&[1.0, 5.0], &k, &v, &[2], 1.0, &mut out);
        assert_eq!(out, [6.0, 8.0]);
    }
}
