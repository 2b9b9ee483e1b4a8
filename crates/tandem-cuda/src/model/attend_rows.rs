//! The model's side of batched decode attention (`attention/rows.rs`): each row's cache through
//! its sequence's buffer table.

use std::ops::Range;

use tandem_model::backend::QkvRows;
use tandem_model::config::RopeParams;
use tandem_model::{graph, ModelError, Span};

use crate::attention::rows::decode_rows_attention_into;
use crate::attention::rows::table_addresses;
use crate::attention::rows::DecodeRowsBuffers;
use crate::attention::rows::ROW_INTS;
use crate::attention::tile::{tile_error, TileShape};
use crate::cache::kv::GpuSequenceKv;
use crate::model::attend::keep_quantized;
use crate::model::{CudaModel, GpuAct};
use crate::ops::rows::quant_flag;
use crate::routes::{self, KvRoute};
use crate::runtime::grid::i32_of;

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
    /// step about 1 ms slower for every sequence in it on the 8B.
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
