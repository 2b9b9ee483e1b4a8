//! The model's side of the tile attention route (`attention/tile.rs`): K and V into the cache,
//! RoPE fused into the store for decode steps, and the merge of the tiles.

use std::cell::RefMut;
use std::ops::Range;

use cudarc::driver::{CudaSlice, PushKernelArg};
use tandem_model::backend::{AttendRows, QkvRows};
use tandem_model::config::RopeParams;
use tandem_model::{graph, ModelError, Span};

use crate::attention::flash::key_range;
use crate::attention::tile::kv_store_into;
use crate::attention::tile::rope_kv_store_into;
use crate::attention::tile::tile_attention_into;
use crate::attention::tile::FreshRow;
use crate::attention::tile::KvCache;
use crate::attention::tile::RopeStoreBuffers;
use crate::attention::tile::RopeStoreShape;
use crate::attention::tile::TileBuffers;
use crate::attention::tile::TileShape;
use crate::cache::kv::GpuSequenceKv;
use crate::matmul::kinds::ActQuant;
use crate::model::{CudaModel, GpuAct, GpuScratch, Mode, Param};
use crate::ops::rows::quant_flag;
use crate::routes::{self, AttentionRoute, KvRoute, ATT_TILE, MATVEC_MAX_ROWS};
use crate::runtime::checked::driver;
use crate::runtime::grid::{i32_of, launch_cfg};
use crate::runtime::pool::DevBuf;
use crate::CudaError;

/// The merge's heads merged together, the format it quantizes the output to, and the buffer it writes
/// that into (`CudaModel::merge_output`).
pub(crate) type MergeOutput = (usize, Option<ActQuant>, Option<DevBuf<u8>>);

/// The output's quantized form the merge wrote, kept with it for the matmul that reads it.
pub(crate) fn keep_quantized(out: &GpuAct, quant: Option<ActQuant>, a: Option<DevBuf<u8>>) {
    if let (Some(fmt), Some(a)) = (quant, a) {
        out.int8.borrow_mut().push((fmt, a));
    }
}

/// The fused decode step's inputs on the model's side: the projections' K and V rows, the staged cache
/// row, and the layer's RoPE.
struct FreshInputs<'a> {
    k: &'a GpuAct,
    v: &'a GpuAct,
    cache_row: Param,
    rope: RopeParams,
    /// The q and k head norms' weights (QK-norm).
    head_norms: Option<(&'a CudaSlice<f32>, &'a CudaSlice<f32>)>,
}

impl CudaModel {
    /// `routes::attention_group_tiles` for a chunk of `t` queries on this GPU, or, for chunks,
    /// `TANDEM_CUDA_GROUP_TILES` (1: always a block per KV head; a large number: never), which exists
    /// to measure the threshold.
    fn attention_group_tiles(&self, t: usize, n_head: usize) -> usize {
        match self.gpu.options.lab.group_tiles {
            Some(tiles) if t > 1 => tiles,
            _ => routes::attention_group_tiles(t, n_head, self.gpu.sm_count as usize),
        }
    }

    /// Tiles a single query can span in a layer (the graph's fixed attention grid).
    pub(crate) fn tile_cap(&self, kv: &GpuSequenceKv, window: Option<usize>) -> usize {
        window.unwrap_or(kv.n_ctx).div_ceil(ATT_TILE) + 1
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attend_from(
        &self,
        io: &mut AttendRows<'_, GpuAct>,
        rows: &Range<usize>,
        kc: &CudaSlice<u16>,
        vc: &CudaSlice<u16>,
        source: (usize, usize, usize),
        positions: &[usize],
        window: Option<usize>,
        tile_cap: usize,
        quant: Option<ActQuant>,
    ) -> Result<(), CudaError> {
        let t = rows.len();
        // Prefill chunks (never captured, so only in direct launches) take the tensor cores when their
        // keys are contiguous in this buffer.
        if self.pass.mode.get() == Mode::Normal
            && routes::attention_route(t, self.routes.deterministic) == AttentionRoute::Flash
        {
            if let Some(keys) = key_range(positions, window, source) {
                return self.profiled("attend (flash)", || {
                    self.attend_flash(io.q, io.out, rows, kc, vc, keys, positions, window)
                });
            }
        }
        let cache = KvCache::Read(kc.as_view(), vc.as_view());
        self.attend_tiles(io, rows, cache, source, positions, window, tile_cap, quant, None)
    }

    /// The tile kernel over `cache` (`source` = capacity, origin_logical, origin_physical), or the
    /// fused decode kernel when `fresh` brings the step's own row.
    #[allow(clippy::too_many_arguments)]
    fn attend_tiles(
        &self,
        io: &mut AttendRows<'_, GpuAct>,
        rows: &Range<usize>,
        cache: KvCache<'_>,
        source: (usize, usize, usize),
        positions: &[usize],
        window: Option<usize>,
        tile_cap: usize,
        quant: Option<ActQuant>,
        fresh: Option<FreshInputs<'_>>,
    ) -> Result<(), CudaError> {
        let c = &self.cpu.config;
        let (capacity, origin_logical, origin_physical) = source;
        let t = rows.len();
        let span = routes::tile_span(positions, window, origin_logical);
        let tile_cap = tile_cap.max(span.n);
        let pos = self.param(positions, "position")?;
        let meta = self.param(&[origin_logical, origin_physical, span.lo, span.n], "placement")?;
        if self.dry() {
            return Ok(());
        }
        let hd = c.head_dim;
        let mut partial = self.act(t * c.n_head * tile_cap, hd + 2)?;
        let qw = c.q_width();
        let (group, quant, mut a) = self.merge_output(quant, t)?;
        let shape = TileShape {
            t,
            n_head: c.n_head,
            n_kv_head: c.n_kv_head,
            head_dim: hd,
            scale: c.attn_scale,
            window,
            capacity,
            tile_cap,
            group,
            quant: quant.map_or(0, quant_flag),
            group_tiles: self.attention_group_tiles(t, c.n_head),
        };
        let mut arrivals = self.arrivals(t * c.n_head)?;
        let fresh = match &fresh {
            Some(f) => Some(FreshRow {
                k: f.k.buf()?.as_view(),
                v: f.v.buf()?.as_view(),
                cache_row: self.view(&f.cache_row),
                rope: f.rope,
                head_norms: f.head_norms.map(|(q, k)| (q.as_view(), k.as_view(), c.eps)),
            }),
            None => None,
        };
        let kernel = if fresh.is_some() {
            "attend (rope + tiles)"
        } else {
            "attend (tiles)"
        };
        let bufs = TileBuffers {
            q: io.q.buf()?.slice(rows.start * qw..rows.end * qw),
            cache,
            pos: self.view(&pos),
            meta: self.view(&meta),
            partial: partial.buf_mut()?,
            arrivals: &mut arrivals,
            out: io.out.buf_mut()?.slice_mut(rows.start * qw..rows.end * qw),
            quants: a.as_deref_mut(),
            fresh,
        };
        self.launch_attention(kernel, || tile_attention_into(&self.gpu, &shape, bufs))?;
        keep_quantized(io.out, quant, a);
        Ok(())
    }

    /// How the merge writes the output for the next matmul (`routes::attention_merge` of the format
    /// that matmul wants, `want`): the heads merged together, the format, and a buffer for `t` rows.
    pub(crate) fn merge_output(&self, want: Option<ActQuant>, t: usize) -> Result<MergeOutput, CudaError> {
        let c = &self.cpu.config;
        let qw = c.q_width();
        let (group, quant) = routes::attention_merge(want, qw, c.head_dim);
        let may_allocate = self.pass.mode.get() == Mode::Normal;
        let a = match quant {
            Some(fmt) => Some(self.buffers.u8_pool.take(&self.gpu, fmt.bytes(t, qw), may_allocate)?),
            None => None,
        };
        Ok((group, quant, a))
    }

    /// An attention kernel's launch, profiled as `kernel`, or skipped (`TANDEM_CUDA_SKIP`).
    pub(crate) fn launch_attention(
        &self,
        kernel: &str,
        launch: impl FnOnce() -> Result<(), CudaError>,
    ) -> Result<(), CudaError> {
        self.profiled(kernel, || {
            if self.skips("attend_tiles") {
                return Ok(());
            }
            launch()
        })
    }

    /// The attention kernel's arrival counters, at least `n` of them (zero between launches: the
    /// merging block resets its own). Grown outside captures only: a decode step's count is set by
    /// the direct step before its graph is captured.
    pub(crate) fn arrivals(&self, n: usize) -> Result<RefMut<'_, CudaSlice<i32>>, CudaError> {
        let mut a = self.buffers.arrivals.borrow_mut();
        if a.len() < n {
            if self.pass.mode.get() == Mode::Capture {
                return Err(CudaError::Driver {
                    what: "attention arrival counters".into(),
                    err: format!("{n} needed while capturing a graph, {} allocated", a.len()),
                });
            }
            // Graphs captured earlier keep the old counters' address: they stay allocated (and zero
            // between launches) for those graphs' replays, never freed for reuse by other buffers.
            let old = std::mem::replace(&mut *a, self.gpu.alloc::<i32>(n)?);
            self.buffers.retired_arrivals.borrow_mut().push(old);
        }
        Ok(a)
    }

    /// Converts rows of K and V to f16 into `kc`/`vc` at rows `dst` (-1: skip).
    pub(crate) fn store(
        &self,
        io: &AttendRows<'_, GpuAct>,
        rows: &Range<usize>,
        dst: Vec<i32>,
        kc: &mut CudaSlice<u16>,
        vc: &mut CudaSlice<u16>,
    ) -> Result<(), CudaError> {
        let dst = self.param_ints(dst)?;
        if self.dry() {
            return Ok(());
        }
        let w = io.k.width;
        let kv = io.k.buf()?.slice(rows.start * w..rows.end * w);
        let vv = io.v.buf()?.slice(rows.start * w..rows.end * w);
        let dst_v = self.view(&dst);
        self.profiled("kv_store", || {
            kv_store_into(&self.gpu, (&kv, &vv), (kc, vc), &dst_v, rows.len(), w)
        })
    }

    /// What an attention call over `rows` of layer `layer` needs besides its rows: the quantized form
    /// the merge writes for the output projection, the layer's window, and the tile grid's cap.
    fn attend_setup(
        &self,
        layer: usize,
        kv: &GpuSequenceKv,
        out_rows: usize,
        rows: &Range<usize>,
    ) -> (Option<ActQuant>, Option<usize>, usize) {
        let t = rows.len();
        // When this call writes every row of the output, the attention kernel quantizes it for the
        // output projection's integer kernel (one launch fewer).
        let whole = rows.start == 0 && rows.end == out_rows;
        let quant = whole
            .then(|| self.int8_input(&self.cpu.weights.layers[layer].wo.name, t))
            .flatten();
        let window = kv.layers[layer].window;
        // One query spans at most `tile_cap` tiles: decode steps keep one grid, so a graph replays.
        let tile_cap = if t == 1 { self.tile_cap(kv, window) } else { 0 };
        (quant, window, tile_cap)
    }

    /// `Backend::rope_store_and_attend`. One span of one row (a decode step) whose row the cache takes
    /// in place: the fused tile kernel (`attend_rope_d*`) rotates q and K, stores K and V and attends,
    /// in one launch. One span of a few rows taken in place: `rope_kv_store` rotates q in place and K
    /// on its way into the cache, then the tile kernel attends (a row's query reads the rows before it
    /// in its chunk, which other blocks store). Several spans of one row each, all taken in place (a
    /// batched decode step): the fused kernel's batched form, one launch for every sequence
    /// (`attend_decode_rows`). Anything else: `rope_qk`, then each span's `store_and_attend`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rope_store_attend(
        &self,
        scratch: &mut GpuScratch,
        layer: usize,
        spans: &mut [Span<GpuSequenceKv>],
        span_rows: &[Range<usize>],
        qkv: QkvRows<'_, GpuAct>,
        positions: &[usize],
        rope: &RopeParams,
    ) -> Result<(), ModelError> {
        if self.takes_decode_rows(layer, spans, span_rows, qkv.q.rows, rope) {
            return self.attend_decode_rows(layer, spans, qkv, positions, rope);
        }
        // The routes below take each span's caches as kernel arguments: a batched graph holding them
        // would write another batch's rows into these sequences' caches.
        if spans.len() > 1 && self.pass.mode.get() != Mode::Normal {
            return Err(ModelError::Kernel(
                "a batched decode graph needs every row on the batched attention kernel".into(),
            ));
        }
        let fused = match (&*spans, span_rows) {
            ([span], [rows]) => {
                let lc = &span.kv.layers[layer];
                rows.len() <= MATVEC_MAX_ROWS
                    && rows.len() == qkv.q.rows
                    && rope.n_rot.is_multiple_of(2)
                    && routes::kv_route(&lc.placement, rows.len(), lc.window) == KvRoute::InPlace
            }
            _ => false,
        };
        if !fused {
            return graph::rope_then_attend_each(self, scratch, layer, spans, span_rows, qkv, positions, rope);
        }
        let kv = &mut *spans[0].kv;
        let rows = span_rows[0].clone();
        let (quant, window, tile_cap) = self.attend_setup(layer, kv, qkv.out.rows, &rows);
        let lc = &mut kv.layers[layer];
        let (dst, after) = routes::store_rows(&lc.placement, rows.len());
        // One row: the attention kernel applies the head norms and RoPE and stores the row itself (one
        // launch). More: the head norms, then `rope_kv_store`.
        let fresh_row = if rows.len() == 1 {
            Some(self.param_ints(dst)?)
        } else {
            if let Some(n) = qkv.head_norms {
                graph::norm_heads(self, qkv.q, qkv.k, n)?;
            }
            self.rope_kv_store(qkv.q, qkv.k, qkv.v, dst, (&mut lc.k, &mut lc.v), positions, rope)?;
            None
        };
        lc.placement = after;
        let p = lc.placement;
        let source = (p.capacity, p.origin_logical, p.origin_physical);
        let mut io = AttendRows {
            q: &*qkv.q,
            k: &*qkv.k,
            v: qkv.v,
            out: qkv.out,
        };
        match fresh_row {
            Some(cache_row) => {
                let fresh = FreshInputs {
                    k: io.k,
                    v: io.v,
                    cache_row,
                    rope: *rope,
                    head_norms: match qkv.head_norms {
                        Some(n) => Some((self.norm(n.q)?, self.norm(n.k)?)),
                        None => None,
                    },
                };
                let cache = KvCache::Write(lc.k.as_view_mut(), lc.v.as_view_mut());
                self.attend_tiles(
                    &mut io,
                    &rows,
                    cache,
                    source,
                    positions,
                    window,
                    tile_cap,
                    quant,
                    Some(fresh),
                )?;
            }
            None => self.attend_from(&mut io, &rows, &lc.k, &lc.v, source, positions, window, tile_cap, quant)?,
        }
        Ok(())
    }

    /// The `rope_kv_store` kernel (`rope_kv_store_into`) on the model's rows.
    #[allow(clippy::too_many_arguments)]
    fn rope_kv_store(
        &self,
        q: &mut GpuAct,
        k: &GpuAct,
        v: &GpuAct,
        dst: Vec<i32>,
        cache: (&mut CudaSlice<u16>, &mut CudaSlice<u16>),
        positions: &[usize],
        rope: &RopeParams,
    ) -> Result<(), ModelError> {
        let dst = self.param_ints(dst)?;
        let pos = self.param(positions, "position")?;
        if self.dry() || self.skips("rope_kv_store") {
            return Ok(());
        }
        let shape = RopeStoreShape {
            rows: q.rows,
            n_head: q.width / self.cpu.config.head_dim,
            n_kv_head: k.width / self.cpu.config.head_dim,
            head_dim: self.cpu.config.head_dim,
            rope: *rope,
        };
        let (kc, vc) = cache;
        let bufs = RopeStoreBuffers {
            q: q.buf_mut()?.as_view_mut(),
            k: k.buf()?.as_view(),
            v: v.buf()?.as_view(),
            kc: kc.as_view_mut(),
            vc: vc.as_view_mut(),
            dst: self.view(&dst),
            pos: self.view(&pos),
        };
        self.profiled("rope + kv_store", || rope_kv_store_into(&self.gpu, &shape, bufs))?;
        Ok(())
    }

    /// `Backend::store_and_attend`.
    pub(crate) fn store_kv_and_attend(
        &self,
        _scratch: &mut GpuScratch,
        layer: usize,
        kv: &mut GpuSequenceKv,
        mut io: AttendRows<'_, GpuAct>,
        rows: Range<usize>,
        positions: &[usize],
    ) -> Result<(), ModelError> {
        {
            let t = rows.len();
            let w = kv.kv_width;
            let (quant, window, tile_cap) = self.attend_setup(layer, kv, io.out.rows, &rows);
            let lc = &mut kv.layers[layer];
            match routes::kv_route(&lc.placement, t, window) {
                KvRoute::InPlace => {
                    let (dst, after) = routes::store_rows(&lc.placement, t);
                    self.store(&io, &rows, dst, &mut lc.k, &mut lc.v)?;
                    lc.placement = after;
                    let p = lc.placement;
                    let source = (p.capacity, p.origin_logical, p.origin_physical);
                    self.attend_from(&mut io, &rows, &lc.k, &lc.v, source, positions, window, tile_cap, quant)?;
                }
                KvRoute::Staged { first, gather } => {
                    let n = gather.len() + t;
                    let mut ks = self.gpu.alloc::<u16>(n * w)?;
                    let mut vs = self.gpu.alloc::<u16>(n * w)?;
                    if !gather.is_empty() {
                        let src = self.param(&gather, "cache row")?;
                        let src_v = self.view(&src);
                        let wi = i32_of(w, "kv width")?;
                        let f = self.gpu.function("kv_gather")?;
                        let mut b = self.gpu.launch_builder(f)?;
                        b.arg(&lc.k).arg(&lc.v).arg(&src_v).arg(&mut ks).arg(&mut vs).arg(&wi);
                        self.profiled("kv_gather", || {
                            driver("kv_gather", unsafe {
                                b.launch(launch_cfg((gather.len() as u32, 1, 1), 256))
                            })
                        })?;
                    }
                    let staged: Vec<i32> = (gather.len()..n).map(|r| r as i32).collect();
                    self.store(&io, &rows, staged, &mut ks, &mut vs)?;
                    self.attend_from(&mut io, &rows, &ks, &vs, (n, first, 0), positions, window, 0, quant)?;
                    // Committed only after attention consumed the staged rows.
                    let (dst, after) = routes::store_rows(&lc.placement, t);
                    self.store(&io, &rows, dst, &mut lc.k, &mut lc.v)?;
                    lc.placement = after;
                }
            }
            Ok(())
        }
    }
}
