//! The prefill attention variants timed on the attention shapes of real models.

use std::time::Instant;

use anyhow::{Context, Result};
use half::f16;
use tandem_cuda::lab::attention::flash::{
    chosen, flash_attention_into, key_range, plan, FlashShape, FlashVariant, KeyRange, VARIANTS,
};
use tandem_cuda::{CudaSlice, Gpu};

use crate::common::{Rng, Row};

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
        .context("flash benchmark: the keys of a buffer holding every position wrap")?;
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

/// Times every variant of each head size on a model's attention shape: Llama-3-8B (128-wide heads,
/// 32 query heads over 8 KV heads), Gemma-3-270M (256-wide, 4 over 1) and SmolLM2-135M (64-wide, 9
/// over 3); a 4096-row chunk from position 0, and the last 512-row chunk of a 4096-token prompt.
/// TFLOP/s count 4 · head size FLOPs per visible (query, key) pair and head.
pub fn flash_bench(gpu: &Gpu, table: &mut Vec<Row>) -> Result<()> {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for (head_dim, n_head, n_kv_head) in [(128usize, 32usize, 8usize), (256, 4, 1), (64, 9, 3)] {
        for (t, prefix) in [(4096, 0), (512, 3584)] {
            let c = Case {
                head_dim,
                n_head,
                n_kv_head,
                t,
                prefix,
                window: None,
            };
            let (q, k16, v16) = random_inputs(&mut rng, &c);
            let inp = upload(gpu, &c, &q, &k16, &v16)?;
            let pairs: f64 = inp.positions.iter().map(|&p| (p + 1) as f64).sum();
            let flops = pairs * 4.0 * (head_dim * n_head) as f64;
            let mut out = gpu.upload(&vec![0f32; q.len()])?;
            for v in VARIANTS
                .iter()
                .filter(|v| v.head_dim == head_dim && v.runs_on(gpu.major))
            {
                let plan = plan_for(gpu, &c, *v, &inp)?;
                launch(gpu, &c, *v, &inp, &plan, &mut out)?;
                gpu.synchronize()?;
                let reps = 20;
                let start = Instant::now();
                for _ in 0..reps {
                    launch(gpu, &c, *v, &inp, &plan, &mut out)?;
                }
                gpu.synchronize()?;
                let secs = start.elapsed().as_secs_f64() / reps as f64;
                let picked = if chosen(head_dim, t, gpu.major) == Some(*v) {
                    " (chosen)"
                } else {
                    ""
                };
                table.push(Row {
                    what: format!(
                        "flash timing {}{picked}, {n_head} heads over {n_kv_head}, {t} queries after {prefix}",
                        v.kernel()
                    ),
                    result: format!("{:.1} us, {:.0} TFLOP/s", secs * 1e6, flops / secs / 1e12),
                });
            }
        }
    }
    Ok(())
}
