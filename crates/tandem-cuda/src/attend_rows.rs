//! A batched decode step's attention: one row of each of several sequences, every row rotated,
//! stored and attended in one launch of the fused decode kernel's batched form
//! (`attend_rope_rows_*` in `kernels/attention.cu`). Each row finds its own cache through its
//! sequence's buffer table (`GpuSequenceKv::buffers`, written once when the sequence is made) and
//! brings its own placement, position and cache row, so each row has the bits its own one-row launch
//! gives (`tandem gpu-check` compares them). A launch a sequence, as before, made a step about 1 ms
//! slower for every sequence in it on the 8B (docs/gpu-runs/2026-12-01-batch).

use std::ops::Range;

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DevicePtr, PushKernelArg};
use tandem_backend::cpu::ops::{RopeParams, RopeStyle};
use tandem_model::backend::QkvRows;
use tandem_model::{graph, ModelError, Span};

use crate::attend::{decode_heads, decode_splits, keep_quantized, tile_error, TileShape};
use crate::device::driver;
use crate::kv::GpuSequenceKv;
use crate::launch::{i32_of, launch_cfg};
use crate::model::{CudaModel, GpuAct};
use crate::routes::{self, KvRoute, ATT_THREADS};
use crate::rows::quant_flag;
use crate::{CudaError, Gpu};

/// Ints a row of the batched decode kernel's table holds (`ROW_INTS` in `kernels/attention.cu`):
/// capacity, origin_logical, origin_physical, first tile, live tiles, position, cache row, unused.
pub const ROW_INTS: usize = 8;

/// A sequence's table of K and V buffer addresses, K then V, layer by layer (`GpuSequenceKv::buffers`):
/// how the batched decode kernel finds a row's caches.
pub fn buffer_table<'a>(
    gpu: &Gpu,
    layers: impl IntoIterator<Item = (&'a CudaSlice<u16>, &'a CudaSlice<u16>)>,
) -> Result<CudaSlice<u64>, CudaError> {
    let mut addresses = Vec::new();
    for (k, v) in layers {
        addresses.push(k.device_ptr(&gpu.stream).0);
        addresses.push(v.device_ptr(&gpu.stream).0);
    }
    if addresses.is_empty() {
        addresses.push(0);
    }
    gpu.upload(&addresses)
}

/// The rows' sequence tables (`buffer_table`) as the kernel's `seqs` argument wants them: each address
/// as two ints, low then high, so the host's integer parameters can carry them.
pub fn table_addresses<'a>(gpu: &Gpu, tables: impl IntoIterator<Item = &'a CudaSlice<u64>>) -> Vec<i32> {
    let mut ints = Vec::new();
    for t in tables {
        let address = t.device_ptr(&gpu.stream).0;
        ints.extend([address as u32 as i32, (address >> 32) as u32 as i32]);
    }
    ints
}

/// The buffers of one launch of the batched fused decode kernel (`attend_rope_rows_*`): `t` decode
/// rows, each of its own sequence. `seqs` holds each row's sequence's buffer table
/// (`GpuSequenceKv::buffers`) as an address split into two ints (low, high); `rows` each row's
/// `ROW_INTS` ints. `q`, `k`, `v`, `out`, `partial`, `arrivals` and `quants` hold `t` rows, as for the
/// tile kernel; q arrives unrotated, K and V as the projections' f32 rows (`FreshRow`).
pub struct DecodeRowsBuffers<'a> {
    pub q: CudaView<'a, f32>,
    pub seqs: CudaView<'a, i32>,
    pub layer: usize,
    pub rows: CudaView<'a, i32>,
    pub partial: &'a mut CudaSlice<f32>,
    pub arrivals: &'a mut CudaSlice<i32>,
    pub out: CudaViewMut<'a, f32>,
    pub quants: Option<&'a mut CudaSlice<u8>>,
    pub k: CudaView<'a, f32>,
    pub v: CudaView<'a, f32>,
    pub rope: RopeParams,
    pub head_norms: Option<(CudaView<'a, f32>, CudaView<'a, f32>, f32)>,
}

/// Launches the batched fused decode kernel: row r's step as `tile_attention_into` with a `FreshRow`
/// runs it alone (same blocks a head, same records and merge), for every row in one launch. The
/// caches' bounds are device data the launch cannot check: each row's cache row and placement must
/// lie within its buffers (`s.capacity` is unused; each row brings its own).
pub fn decode_rows_attention_into(gpu: &Gpu, s: &TileShape, b: DecodeRowsBuffers<'_>) -> Result<(), CudaError> {
    if !routes::head_dim_supported(s.head_dim) {
        return Err(CudaError::UnsupportedHeadDim(s.head_dim));
    }
    let (qw, kvw, t) = (s.n_head * s.head_dim, s.n_kv_head * s.head_dim, s.t);
    let need = [
        ("queries", b.q.len(), t * qw),
        ("output", b.out.len(), t * qw),
        ("rows' K and V", b.k.len().min(b.v.len()), t * kvw),
        ("sequence tables", b.seqs.len(), 2 * t),
        ("row table", b.rows.len(), ROW_INTS * t),
        (
            "partials",
            b.partial.len(),
            t * s.n_head * s.tile_cap * (s.head_dim + 2),
        ),
        ("arrival counters", b.arrivals.len(), t * s.n_head),
        (
            "head norms",
            b.head_norms
                .as_ref()
                .map_or(s.head_dim, |(q, k, _)| q.len().min(k.len())),
            s.head_dim,
        ),
        (
            "quantized output",
            if s.quant == 0 {
                t * qw
            } else {
                b.quants.as_ref().map_or(0, |a| a.len())
            },
            t * qw,
        ),
    ];
    if let Some((what, have, need)) = need.into_iter().find(|(_, have, need)| have < need) {
        return Err(CudaError::Driver {
            what: format!("batched decode attention {what}"),
            err: format!("{have} elements, {need} needed"),
        });
    }
    let groups_fit =
        s.n_kv_head > 0 && s.n_head.is_multiple_of(s.n_kv_head) && s.group > 0 && s.n_head.is_multiple_of(s.group);
    let n_rot = b.rope.n_rot;
    // A row a grid layer (gridDim.z holds at most 65,535).
    if !groups_fit || !n_rot.is_multiple_of(2) || n_rot > s.head_dim || !(1..=65_535).contains(&t) {
        return Err(tile_error(format!(
            "{t} rows, {} heads over {} KV heads in merge groups of {}, n_rot {n_rot} of head size {}",
            s.n_head, s.n_kv_head, s.group, s.head_dim
        )));
    }
    let ints = |n: usize, what: &str| i32_of(n, what);
    let (kvw_i, layer) = (ints(kvw, "kv width")?, ints(b.layer, "layer")?);
    let (nh, nkv) = (ints(s.n_head, "heads")?, ints(s.n_kv_head, "kv heads")?);
    let (win, tc) = (ints(s.window.unwrap_or(0), "window")?, ints(s.tile_cap, "tiles")?);
    let (group, n_t, n_rot) = (
        ints(s.group, "heads per group")?,
        ints(t, "rows")?,
        ints(n_rot, "n_rot")?,
    );
    let name = match decode_heads(gpu, s) {
        1 => format!("attend_rope_rows_d{}", s.head_dim),
        nh => format!("attend_rope_rows_h{nh}_d{}", s.head_dim),
    };
    let grid = (decode_splits(gpu, s) as u32, s.n_head as u32, t as u32);
    let f = gpu.function(&name)?;
    let mut l = gpu.launch_builder(f)?;
    l.arg(&b.q).arg(&b.seqs).arg(&layer).arg(&b.rows).arg(&kvw_i);
    l.arg(&nh).arg(&nkv).arg(&s.scale).arg(&win).arg(&tc);
    l.arg(b.partial).arg(b.arrivals);
    let mut out = b.out;
    l.arg(&mut out).arg(&group).arg(&s.quant);
    let no_quants = 0u64;
    match b.quants {
        Some(a) => l.arg(a),
        None => l.arg(&no_quants),
    };
    let neox = i32::from(b.rope.style == RopeStyle::Neox);
    l.arg(&b.k).arg(&b.v).arg(&n_rot);
    l.arg(&b.rope.freq_base).arg(&b.rope.freq_scale).arg(&neox);
    let (no_norm, no_eps) = (0u64, 0f32);
    match &b.head_norms {
        Some((qn, kn, eps)) => l.arg(qn).arg(kn).arg(eps),
        None => l.arg(&no_norm).arg(&no_norm).arg(&no_eps),
    };
    l.arg(&n_t);
    // SAFETY: the arguments match the kernel's signature in order and type; every buffer holds what
    // the grid reads or writes (checked above), and each row's caches are its sequence's (the caller's
    // placements keep their rows within them).
    driver(&name, unsafe { l.launch(launch_cfg(grid, ATT_THREADS as u32)) })?;
    Ok(())
}

impl CudaModel {
    /// The tiles a batched step's attention grid spans in a layer of `window`: `routes::batch_tiles`
    /// of the furthest row, within the most any row's cache holds. A function of the rows' count,
    /// furthest position and largest context alone, as a batched decode graph's key
    /// (`decode_graph::GraphKey::Batch`) needs: its grid and partial buffers are fixed at capture.
    pub(crate) fn batch_tile_cap(
        &self,
        spans: &[Span<GpuSequenceKv>],
        positions: &[usize],
        window: Option<usize>,
    ) -> usize {
        let furthest = positions.iter().copied().max().unwrap_or(0);
        let most = spans.iter().map(|s| self.tile_cap(s.kv, window)).max().unwrap_or(1);
        routes::batch_tiles(furthest).min(most)
    }

    /// Whether a pass of several spans is a batched decode step the batched fused kernel takes: one
    /// row a span (the rows in span order), every row's cache taken in place. Launched directly,
    /// captured or replayed: its kernel finds each row's caches through the tables in its parameters,
    /// so a graph captured for some sequences serves any others of the same count
    /// (`decode_graph::GraphKey::Batch`).
    pub(crate) fn takes_decode_rows(
        &self,
        layer: usize,
        spans: &[Span<GpuSequenceKv>],
        span_rows: &[Range<usize>],
        q_rows: usize,
        rope: &RopeParams,
    ) -> bool {
        graph::is_decode_batch(span_rows)
            && span_rows.len() == spans.len()
            && q_rows == spans.len()
            && rope.n_rot.is_multiple_of(2)
            && spans.iter().all(|s| {
                let lc = &s.kv.layers[layer];
                routes::kv_route(&lc.placement, 1, lc.window) == KvRoute::InPlace
            })
    }

    /// A batched decode step's attention (`takes_decode_rows`): every row rotated, stored and attended
    /// in one launch of `attend_rope_rows_*`, each with its own sequence's cache and placement, and
    /// each with the bits its own fused launch would give. A launch a sequence, as before, made the
    /// step about 1 ms slower for every sequence in it on the 8B (docs/gpu-runs/2026-12-01-batch).
    pub(crate) fn attend_decode_rows(
        &self,
        layer: usize,
        spans: &mut [Span<GpuSequenceKv>],
        qkv: QkvRows<'_, GpuAct>,
        positions: &[usize],
        rope: &RopeParams,
    ) -> Result<(), ModelError> {
        let c = &self.cpu.config;
        let (t, hd) = (spans.len(), c.head_dim);
        let window = spans[0].kv.layers[layer].window;
        let mut ints = Vec::with_capacity(ROW_INTS * t);
        let seqs = table_addresses(&self.gpu, spans.iter().map(|s| &s.kv.buffers));
        let tile_cap = self.batch_tile_cap(spans, positions, window);
        // Every row's placement after the step, set only once all rows' parameters are made, so an
        // error leaves every sequence as it was.
        let mut afters = Vec::with_capacity(t);
        for (span, &p) in spans.iter().zip(positions) {
            let (dst, after) = routes::store_rows(&span.kv.layers[layer].placement, 1);
            afters.push(after);
            let tiles = routes::tile_span(&[p], window, after.origin_logical);
            if tiles.n > tile_cap {
                return Err(tile_error(format!("a row spans {} tiles, the batch's grid {tile_cap}", tiles.n)).into());
            }
            for v in [
                after.capacity,
                after.origin_logical,
                after.origin_physical,
                tiles.lo,
                tiles.n,
                p,
            ] {
                ints.push(i32_of(v, "attention row")?);
            }
            ints.extend([dst.first().copied().unwrap_or(-1), 0]);
        }
        for (span, after) in spans.iter_mut().zip(afters) {
            span.kv.layers[layer].placement = after;
        }
        let rows = self.param_ints(ints)?;
        let seqs = self.param_addresses(seqs)?;
        if self.dry() {
            return Ok(());
        }
        let quant = self.int8_input(&self.cpu.weights.layers[layer].wo.name, t);
        let (group, quant, mut a) = self.merge_output(quant, t)?;
        let mut partial = self.act(t * c.n_head * tile_cap, hd + 2)?;
        let mut arrivals = self.arrivals(t * c.n_head)?;
        let shape = TileShape {
            t,
            n_head: c.n_head,
            n_kv_head: c.n_kv_head,
            head_dim: hd,
            scale: c.attn_scale,
            window,
            capacity: 0,
            tile_cap,
            group,
            quant: quant.map_or(0, quant_flag),
            group_tiles: usize::MAX,
        };
        let head_norms = match qkv.head_norms {
            Some(n) => Some((self.norm(n.q)?.as_view(), self.norm(n.k)?.as_view(), c.eps)),
            None => None,
        };
        let bufs = DecodeRowsBuffers {
            q: qkv.q.buf()?.as_view(),
            seqs: self.view(&seqs),
            layer,
            rows: self.view(&rows),
            partial: partial.buf_mut()?,
            arrivals: &mut arrivals,
            out: qkv.out.buf_mut()?.as_view_mut(),
            quants: a.as_deref_mut(),
            k: qkv.k.buf()?.as_view(),
            v: qkv.v.buf()?.as_view(),
            rope: *rope,
            head_norms,
        };
        self.launch_attention("attend (rope + tiles, rows)", || {
            decode_rows_attention_into(&self.gpu, &shape, bufs)
        })?;
        keep_quantized(qkv.out, quant, a);
        Ok(())
    }
}
