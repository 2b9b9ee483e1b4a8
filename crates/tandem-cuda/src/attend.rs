//! The CUDA backend's attention outside the flash route (`flash.rs`): K and V stored into the
//! cache (or a staging buffer when the chunk meets a wrapped ring), then the tile kernel, whose last
//! block per query and head merges the tiles (`kernels/attention.cu`).

use std::cell::RefMut;
use std::ops::Range;

use cudarc::driver::{CudaSlice, PushKernelArg};
use tandem_backend::cpu::ops::{RopeParams, RopeStyle};
use tandem_model::backend::{AttendRows, QkvRows};
use tandem_model::{graph, ModelError, Span};

use crate::device::driver;
use crate::flash::key_range;
use crate::int8::ActQuant;
use crate::kv::GpuSequenceKv;
use crate::launch::{blocks, i32_of, launch_cfg};
use crate::model::{CudaModel, GpuAct, GpuScratch, Mode};
use crate::routes::{self, AttentionRoute, KvRoute, ATT_TILE, MATVEC_MAX_ROWS};
use crate::rows::quant_flag;
use crate::CudaError;

impl CudaModel {
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
        let c = &self.cpu.config;
        let (capacity, origin_logical, origin_physical) = source;
        let t = rows.len();
        // Prefill chunks (never captured, so only in direct launches) take the tensor cores when their
        // keys are contiguous in this buffer.
        if self.mode.get() == Mode::Normal && routes::attention_route(t, self.deterministic) == AttentionRoute::Flash {
            if let Some(keys) = key_range(positions, window, source) {
                return self.profiled("attend (flash)", || {
                    self.attend_flash(io, rows, kc, vc, keys, positions, window)
                });
            }
        }
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
        let q_view = io.q.buf()?.slice(rows.start * qw..rows.end * qw);
        let ints = |n: usize, what: &str| i32_of(n, what);
        let (cap, kvw) = (ints(capacity, "capacity")?, ints(c.kv_width(), "kv width")?);
        let (nh, nkv, hdi) = (
            ints(c.n_head, "heads")?,
            ints(c.n_kv_head, "kv heads")?,
            ints(hd, "head dim")?,
        );
        let (win, tc) = (ints(window.unwrap_or(0), "window")?, ints(tile_cap, "tiles")?);
        let scale = c.attn_scale;
        let (pos_v, meta_v) = (self.view(&pos), self.view(&meta));
        // The merge can quantize the output for the next matmul (`routes::attention_merge`).
        let (group, quant) = routes::attention_merge(quant, qw, hd);
        let may_allocate = self.mode.get() == Mode::Normal;
        let mut a = match quant {
            Some(fmt) => Some(self.u8_pool.take(&self.gpu, fmt.bytes(t, qw), may_allocate)?),
            None => None,
        };
        let quant_code = quant.map_or(0, quant_flag);
        let (group_i, n_t) = (ints(group, "heads per group")?, ints(t, "rows")?);
        let mut arrivals = self.arrivals(t * c.n_head)?;
        let mut out_view = io.out.buf_mut()?.slice_mut(rows.start * qw..rows.end * qw);
        self.profiled("attend (tiles)", || {
            let f = self.gpu.function("attend_tiles")?;
            let mut b = self.gpu.launch_builder(f)?;
            b.arg(&q_view)
                .arg(kc)
                .arg(vc)
                .arg(&cap)
                .arg(&kvw)
                .arg(&pos_v)
                .arg(&meta_v);
            b.arg(&nh)
                .arg(&nkv)
                .arg(&hdi)
                .arg(&scale)
                .arg(&win)
                .arg(&tc)
                .arg(partial.buf_mut()?)
                .arg(&mut *arrivals)
                .arg(&mut out_view)
                .arg(&group_i)
                .arg(&quant_code);
            let no_quants = 0u64;
            match a.as_deref_mut() {
                Some(a) => b.arg(a),
                None => b.arg(&no_quants),
            };
            b.arg(&n_t);
            let grid = (tile_cap as u32, c.n_head as u32, t as u32);
            if !self.skips("attend_tiles") {
                driver("attend_tiles", unsafe { b.launch(launch_cfg(grid, ATT_TILE as u32)) })?;
            }
            Ok(())
        })?;
        if let (Some(fmt), Some(a)) = (quant, a) {
            io.out.int8.borrow_mut().push((fmt, a));
        }
        Ok(())
    }

    /// The attention kernel's arrival counters, at least `n` of them (zero between launches: the
    /// merging block resets its own). Grown outside captures only: a decode step's count is set by
    /// the direct step before its graph is captured.
    fn arrivals(&self, n: usize) -> Result<RefMut<'_, CudaSlice<i32>>, CudaError> {
        let mut a = self.arrivals.borrow_mut();
        if a.len() < n {
            if self.mode.get() == Mode::Capture {
                return Err(CudaError::Driver {
                    what: "attention arrival counters".into(),
                    err: format!("{n} needed while capturing a graph, {} allocated", a.len()),
                });
            }
            *a = self.gpu.alloc::<i32>(n)?;
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
        let wi = i32_of(w, "kv width")?;
        let dst_v = self.view(&dst);
        let f = self.gpu.function("kv_store")?;
        let mut b = self.gpu.launch_builder(f)?;
        b.arg(&kv).arg(&vv).arg(kc).arg(vc).arg(&dst_v).arg(&wi);
        self.profiled("kv_store", || {
            driver("kv_store", unsafe {
                b.launch(launch_cfg((rows.len() as u32, 1, 1), 256))
            })
        })?;
        Ok(())
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

    /// `Backend::rope_store_and_attend`. One span of a few rows (a decode step) whose chunk the cache
    /// takes in place: `rope_kv_store` rotates q in place and K on its way into the cache, then the
    /// tile kernel attends. Anything else: `rope_qk`, then each span's `store_and_attend`.
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
        self.rope_kv_store(qkv.q, qkv.k, qkv.v, dst, (&mut lc.k, &mut lc.v), positions, rope)?;
        lc.placement = after;
        let p = lc.placement;
        let source = (p.capacity, p.origin_logical, p.origin_physical);
        let mut io = AttendRows {
            q: &*qkv.q,
            k: &*qkv.k,
            v: qkv.v,
            out: qkv.out,
        };
        self.attend_from(&mut io, &rows, &lc.k, &lc.v, source, positions, window, tile_cap, quant)?;
        Ok(())
    }

    /// The `rope_kv_store` kernel: RoPE on every row of `q` (in place) and of `k`, whose rotated rows
    /// go with `v`'s to cache rows `dst` (-1: skip) of `cache` (K, V).
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
        if self.dry() {
            return Ok(());
        }
        let hd = self.cpu.config.head_dim;
        let (rows, nq, nkv) = (q.rows, q.width / hd, k.width / hd);
        let n = rows * (nq + nkv) * (rope.n_rot / 2);
        let ints = |n: usize, what: &str| i32_of(n, what);
        let (rows_i, nq_i, nkv_i) = (ints(rows, "rows")?, ints(nq, "heads")?, ints(nkv, "kv heads")?);
        let (hd_i, nr_i) = (ints(hd, "head dim")?, ints(rope.n_rot, "n_rot")?);
        let neox = i32::from(matches!(rope.style, RopeStyle::Neox));
        let (dst_v, pos_v) = (self.view(&dst), self.view(&pos));
        let (kc, vc) = cache;
        let f = self.gpu.function("rope_kv_store")?;
        let mut b = self.gpu.launch_builder(f)?;
        b.arg(q.buf_mut()?)
            .arg(k.buf()?)
            .arg(v.buf()?)
            .arg(kc)
            .arg(vc)
            .arg(&dst_v)
            .arg(&pos_v);
        b.arg(&rows_i).arg(&nq_i).arg(&nkv_i).arg(&hd_i).arg(&nr_i);
        b.arg(&rope.freq_base).arg(&rope.freq_scale).arg(&neox);
        if self.skips("rope_kv_store") {
            return Ok(());
        }
        self.profiled("rope + kv_store", || {
            driver("rope_kv_store", unsafe {
                b.launch(launch_cfg((blocks(n, 128), 1, 1), 128))
            })
        })?;
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
