//! The batched fused decode kernel (`attend_rope_rows_*`: a serving engine's decode step, one row for
//! each of several sequences with caches of their own, in one launch) against the one-row fused kernel
//! (`attend_rope_*`, checked against f64 attention in `tiles.rs`) launched for each row alone, bit for
//! bit: the output, the output quantized for the next matmul, and both caches. A row's bits must not
//! depend on the rows launched with it: that is what lets `--deterministic` promise a request the same
//! logits alone or batched.

use anyhow::Result;
use half::f16;
use tandem_cuda::lab::attention::rows::{
    buffer_table, decode_rows_attention_into, table_addresses, DecodeRowsBuffers, ROW_INTS,
};
use tandem_cuda::lab::attention::tile::{tile_attention_into, FreshRow, KvCache, TileBuffers, TileShape};
use tandem_cuda::lab::matmul::kinds::ActQuant;
use tandem_cuda::lab::ops::rows::quant_flag;
use tandem_cuda::lab::routes::{attention_merge, tile_span};
use tandem_cuda::{CudaSlice, Gpu};
use tandem_model::config::{RopeParams, RopeStyle};

use crate::common::{Rng, Row};

#[test]
fn batched_decode_rows_equal_each_row_alone() {
    crate::common::run("batched decode attention checks", decode_rows_checks);
}

/// One sequence of a batch: its buffer of `capacity` rows holds logical position `origin.0` at
/// physical row `origin.1` (a ring once it wraps); the step's row is at `position`.
struct Seq {
    capacity: usize,
    origin: (usize, usize),
    position: usize,
}

impl Seq {
    fn physical(&self, p: usize) -> usize {
        (self.origin.1 + p - self.origin.0) % self.capacity
    }
}

/// A batch: the model's heads, the layer's window and RoPE, and the format the merge quantizes to.
struct Batch {
    head_dim: usize,
    n_head: usize,
    n_kv_head: usize,
    window: Option<usize>,
    rope: RopeParams,
    quant: Option<ActQuant>,
    seqs: Vec<Seq>,
}

/// One sequence's step: q, K and V unrotated (f32), and its cache (f16 bits) with the step's row NaN.
struct Step {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    kc: Vec<u16>,
    vc: Vec<u16>,
}

/// What the launches left, per row: the output, the quantized output (in the one-row layout), and the
/// row's cache.
#[derive(PartialEq)]
struct Outcome {
    out: Vec<Vec<u32>>,
    quants: Vec<Vec<u8>>,
    caches: Vec<(Vec<u16>, Vec<u16>)>,
}

const EPS: f32 = 1e-6;

pub(crate) fn decode_rows_checks(gpu: &Gpu, rng: &mut Rng, table: &mut Vec<Row>) -> Result<()> {
    let seq = |capacity, origin, position| Seq {
        capacity,
        origin,
        position,
    };
    let rope = |n_rot, style, freq_base| RopeParams {
        style,
        n_rot,
        freq_base,
        freq_scale: 1.0,
    };
    let batches = [
        // The 8B's heads: an empty context, a tile boundary, three tiles, and deep enough for two heads a
        // block; each cache a different size; merged two heads to a Q8_K block.
        Batch {
            head_dim: 128,
            n_head: 32,
            n_kv_head: 8,
            window: None,
            rope: rope(128, RopeStyle::Neox, 500_000.0),
            quant: Some(ActQuant::Q8K),
            seqs: vec![
                seq(16, (0, 0), 0),
                seq(200, (0, 0), 128),
                seq(340, (0, 0), 300),
                seq(4800, (0, 0), 4700),
            ],
        },
        // Sliding-window rings: one wrapped (position 1002 over row 490), one not yet full, one that
        // wrapped once; Q8 blocks within each head.
        Batch {
            head_dim: 256,
            n_head: 4,
            n_kv_head: 1,
            window: Some(512),
            rope: rope(256, RopeStyle::Neox, 1_000_000.0),
            quant: Some(ActQuant::Q8),
            seqs: vec![seq(512, (491, 491), 1002), seq(512, (0, 0), 5), seq(512, (89, 89), 600)],
        },
        // Part of each head rotated, grouped heads, a small window, no quantization.
        Batch {
            head_dim: 64,
            n_head: 9,
            n_kv_head: 3,
            window: Some(20),
            rope: rope(32, RopeStyle::Interleaved, 10_000.0),
            quant: None,
            seqs: vec![seq(64, (0, 0), 47), seq(64, (0, 0), 3), seq(64, (0, 0), 20)],
        },
    ];
    for b in &batches {
        for norms in [false, true] {
            check_batch(gpu, rng, b, norms, table)?;
        }
    }
    Ok(())
}

fn check_batch(gpu: &Gpu, rng: &mut Rng, b: &Batch, norms: bool, table: &mut Vec<Row>) -> Result<()> {
    let (qw, kvw) = (b.n_head * b.head_dim, b.n_kv_head * b.head_dim);
    let steps: Vec<Step> = b
        .seqs
        .iter()
        .map(|s| {
            let mut normal = |n: usize| (0..n).map(|_| rng.normal()).collect::<Vec<f32>>();
            let (q, k, v) = (normal(qw), normal(kvw), normal(kvw));
            let mut cache = || -> Vec<u16> {
                let mut c: Vec<u16> = normal(s.capacity * kvw)
                    .iter()
                    .map(|&x| f16::from_f32(x).to_bits())
                    .collect();
                let row = s.physical(s.position) * kvw;
                c[row..row + kvw].fill(f16::NAN.to_bits());
                c
            };
            let (kc, vc) = (cache(), cache());
            Step { q, k, v, kc, vc }
        })
        .collect();
    let norm_weights: Option<(Vec<f32>, Vec<f32>)> = norms.then(|| {
        let mut w = || (0..b.head_dim).map(|_| 1.0 + 0.25 * rng.normal()).collect::<Vec<f32>>();
        (w(), w())
    });
    let alone = Outcome::merge(
        b.seqs
            .iter()
            .zip(&steps)
            .map(|(s, st)| one_row(gpu, b, s, st, norm_weights.as_ref()))
            .collect::<Result<Vec<_>>>()?,
    );
    let together = batched(gpu, b, &steps, norm_weights.as_ref())?;
    let finite = together.out.iter().flatten().all(|&x| f32::from_bits(x).is_finite());
    let out_equal = together.out == alone.out;
    let quants_equal = together.quants == alone.quants;
    let caches_equal = together.caches == alone.caches;
    let positions: Vec<usize> = b.seqs.iter().map(|s| s.position).collect();
    table.push(Row {
        check: format!(
            "batched fused decode d{} {}/{} heads, window {:?}, {} rows at positions {positions:?}, quant {:?}, \
             QK-norm {norms}",
            b.head_dim,
            b.n_head,
            b.n_kv_head,
            b.window,
            b.seqs.len(),
            b.quant
        ),
        result: format!(
            "each row bit-equal to its own one-row launch: output {out_equal} (all finite: {finite}), \
             quantized {quants_equal}, caches {caches_equal}"
        ),
        pass: finite && out_equal && quants_equal && caches_equal,
    });
    Ok(())
}

impl Outcome {
    fn merge(parts: Vec<Outcome>) -> Outcome {
        let mut all = Outcome {
            out: vec![],
            quants: vec![],
            caches: vec![],
        };
        for p in parts {
            all.out.extend(p.out);
            all.quants.extend(p.quants);
            all.caches.extend(p.caches);
        }
        all
    }
}

/// Row `r` of `t` quantized rows of `cols` (quants, then Q8_K's sums of 16, then the block scales), in
/// the layout of one row.
fn quant_row(fmt: ActQuant, a: &[u8], t: usize, r: usize, cols: usize) -> Vec<u8> {
    let sums = if fmt == ActQuant::Q8K { (cols / 16) * 4 } else { 0 };
    let scales = (cols / fmt.block()) * 4;
    let mut row = a[r * cols..(r + 1) * cols].to_vec();
    let sums_at = t * cols + r * sums;
    row.extend_from_slice(&a[sums_at..sums_at + sums]);
    let scales_at = t * cols + t * sums + r * scales;
    row.extend_from_slice(&a[scales_at..scales_at + scales]);
    row
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// The merge group and kernel flag of the batch's quantization.
fn merge(b: &Batch) -> (usize, Option<ActQuant>) {
    attention_merge(b.quant, b.n_head * b.head_dim, b.head_dim)
}

fn shape(b: &Batch, t: usize, capacity: usize, tile_cap: usize) -> TileShape {
    let (group, quant) = merge(b);
    TileShape {
        t,
        n_head: b.n_head,
        n_kv_head: b.n_kv_head,
        head_dim: b.head_dim,
        scale: 1.0 / (b.head_dim as f32).sqrt(),
        window: b.window,
        capacity,
        tile_cap,
        group,
        quant: quant.map_or(0, quant_flag),
        group_tiles: usize::MAX,
    }
}

/// A launch's outputs for `t` rows, poisoned (NaN, 0xA5) so that an unwritten element shows, and its
/// arrival counters, zeroed.
struct Outputs {
    partial: CudaSlice<f32>,
    arrivals: CudaSlice<i32>,
    out: CudaSlice<f32>,
    a: Option<CudaSlice<u8>>,
}

impl Outputs {
    fn new(gpu: &Gpu, b: &Batch, t: usize, tile_cap: usize) -> Result<Self> {
        let qw = b.n_head * b.head_dim;
        Ok(Outputs {
            partial: gpu.upload(&vec![f32::NAN; t * b.n_head * tile_cap * (b.head_dim + 2)])?,
            arrivals: gpu.alloc::<i32>(t * b.n_head)?,
            out: gpu.upload(&vec![f32::NAN; t * qw])?,
            a: match merge(b).1 {
                Some(f) => Some(gpu.upload(&vec![0xA5u8; f.bytes(t, qw)])?),
                None => None,
            },
        })
    }

    /// Each row's output bits and quantized output (in the one-row layout), with the rows' `caches`
    /// as read back; the counters must be back at zero.
    fn read(&self, gpu: &Gpu, b: &Batch, t: usize, caches: Vec<(Vec<u16>, Vec<u16>)>) -> Result<Outcome> {
        let qw = b.n_head * b.head_dim;
        let counters = gpu.download(&self.arrivals)?;
        anyhow::ensure!(
            counters.iter().all(|&c| c == 0),
            "decode attention left arrival counters set"
        );
        let out = gpu.download(&self.out)?.chunks(qw).map(bits).collect();
        let quants = match (merge(b).1, &self.a) {
            (Some(f), Some(a)) => {
                let host = gpu.download(a)?;
                (0..t).map(|r| quant_row(f, &host, t, r, qw)).collect()
            }
            _ => vec![vec![]; t],
        };
        Ok(Outcome { out, quants, caches })
    }
}

/// The head norms' weights on the device, when the check applies QK-norm.
fn upload_norms(gpu: &Gpu, norms: Option<&(Vec<f32>, Vec<f32>)>) -> Result<Option<(CudaSlice<f32>, CudaSlice<f32>)>> {
    Ok(match norms {
        Some((qn, kn)) => Some((gpu.upload(qn)?, gpu.upload(kn)?)),
        None => None,
    })
}

/// Sequence `s`'s step through the one-row fused kernel.
fn one_row(gpu: &Gpu, b: &Batch, s: &Seq, st: &Step, norms: Option<&(Vec<f32>, Vec<f32>)>) -> Result<Outcome> {
    let p = s.position;
    let span = tile_span(&[p], b.window, s.origin.0);
    let tile_cap = span.n + 1;
    let sh = shape(b, 1, s.capacity, tile_cap);
    let (q, fk, fv) = (gpu.upload(&st.q)?, gpu.upload(&st.k)?, gpu.upload(&st.v)?);
    let (mut kc, mut vc) = (gpu.upload(&st.kc)?, gpu.upload(&st.vc)?);
    let pos = gpu.upload(&[p as i32])?;
    let meta = gpu.upload(&[s.origin.0, s.origin.1, span.lo, span.n].map(|x| x as i32))?;
    let row = gpu.upload(&[s.physical(p) as i32])?;
    let mut o = Outputs::new(gpu, b, 1, tile_cap)?;
    let norms = upload_norms(gpu, norms)?;
    let bufs = TileBuffers {
        q: q.as_view(),
        cache: KvCache::Write(kc.as_view_mut(), vc.as_view_mut()),
        pos: pos.as_view(),
        meta: meta.as_view(),
        partial: &mut o.partial,
        arrivals: &mut o.arrivals,
        out: o.out.as_view_mut(),
        quants: o.a.as_mut(),
        fresh: Some(FreshRow {
            k: fk.as_view(),
            v: fv.as_view(),
            cache_row: row.as_view(),
            rope: b.rope,
            head_norms: norms.as_ref().map(|(q, k)| (q.as_view(), k.as_view(), EPS)),
        }),
    };
    tile_attention_into(gpu, &sh, bufs)?;
    o.read(gpu, b, 1, vec![(gpu.download(&kc)?, gpu.download(&vc)?)])
}

/// Every sequence's step in one launch of the batched kernel.
fn batched(gpu: &Gpu, b: &Batch, steps: &[Step], norms: Option<&(Vec<f32>, Vec<f32>)>) -> Result<Outcome> {
    let t = steps.len();
    let flat = |f: fn(&Step) -> &Vec<f32>| steps.iter().flat_map(|s| f(s).iter().copied()).collect::<Vec<f32>>();
    let (q, fk, fv) = (
        gpu.upload(&flat(|s| &s.q))?,
        gpu.upload(&flat(|s| &s.k))?,
        gpu.upload(&flat(|s| &s.v))?,
    );
    let caches = steps
        .iter()
        .map(|st| Ok((gpu.upload(&st.kc)?, gpu.upload(&st.vc)?)))
        .collect::<Result<Vec<_>>>()?;
    let tables = caches
        .iter()
        .map(|(k, v)| buffer_table(gpu, [(k, v)]))
        .collect::<Result<Vec<_>, _>>()?;
    let seqs = gpu.upload(&table_addresses(gpu, &tables))?;
    let mut rows = Vec::with_capacity(ROW_INTS * t);
    let mut tile_cap = 0;
    for s in &b.seqs {
        let p = s.position;
        let span = tile_span(&[p], b.window, s.origin.0);
        // One tile more than live, as each row alone had.
        tile_cap = tile_cap.max(span.n + 1);
        let ints = [s.capacity, s.origin.0, s.origin.1, span.lo, span.n, p, s.physical(p), 0];
        rows.extend(ints.map(|x| x as i32));
    }
    let rows = gpu.upload(&rows)?;
    let sh = shape(b, t, 0, tile_cap);
    let mut o = Outputs::new(gpu, b, t, tile_cap)?;
    let norms = upload_norms(gpu, norms)?;
    let bufs = DecodeRowsBuffers {
        q: q.as_view(),
        seqs: seqs.as_view(),
        layer: 0,
        rows: rows.as_view(),
        partial: &mut o.partial,
        arrivals: &mut o.arrivals,
        out: o.out.as_view_mut(),
        quants: o.a.as_mut(),
        k: fk.as_view(),
        v: fv.as_view(),
        rope: b.rope,
        head_norms: norms.as_ref().map(|(q, k)| (q.as_view(), k.as_view(), EPS)),
    };
    decode_rows_attention_into(gpu, &sh, bufs)?;
    let caches = caches
        .iter()
        .map(|(k, v)| Ok((gpu.download(k)?, gpu.download(v)?)))
        .collect::<Result<Vec<_>>>()?;
    o.read(gpu, b, t, caches)
}
