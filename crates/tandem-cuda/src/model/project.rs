//! The attention block's projections and its attention as one route for a prefill chunk: q, k and v
//! from one stacked GEMM, whose product `split_rope_kv_store` cuts, rotates and stores (q to its
//! activation, K and V straight into the cache), then flash attention. The unfused route makes the
//! same bits in four launches (the GEMM, `split_columns`, `rope`, `kv_store`) and writes K and V in
//! f32 twice on the way.

use std::ops::Range;

use tandem_model::backend::HeadNorms;
use tandem_model::config::RopeParams;
use tandem_model::weights::Matrix;
use tandem_model::{ModelError, Span};

use crate::attention::flash::key_range;
use crate::attention::tile::{split_rope_kv_store_into, RopeStoreShape, SplitRopeStoreBuffers};
use crate::cache::kv::GpuSequenceKv;
use crate::model::{CudaModel, GpuAct, GpuScratch, Mode};
use crate::routes::{self, AttentionRoute, KvRoute};

impl CudaModel {
    /// `Backend::project_and_attend`: the fused route where it applies (`fused_projection`), else
    /// `matmuls`, then `rope_store_attend`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn project_rope_store_attend(
        &self,
        scratch: &mut GpuScratch,
        layer: usize,
        spans: &mut [Span<GpuSequenceKv>],
        span_rows: &[Range<usize>],
        x: GpuAct,
        m: [&Matrix; 3],
        out: &mut GpuAct,
        head_norms: Option<HeadNorms<'_>>,
        positions: &[usize],
        rope: &RopeParams,
    ) -> Result<(), ModelError> {
        if head_norms.is_none() {
            if let ([span], [rows]) = (&mut *spans, span_rows) {
                if rows.start == 0
                    && rows.end == x.rows
                    && self.fused_projection(layer, span.kv, &x, m, out, positions, rope)?
                {
                    return Ok(());
                }
            }
        }
        tandem_model::graph::project_then_attend(
            self, scratch, layer, spans, span_rows, x, m, out, head_norms, positions, rope,
        )
    }

    /// The fused route for one span's chunk, when every part of it applies: direct launches (prefill is
    /// never captured), the stacked q/k/v GEMM for these rows (`stacked_route`), the cache taking the
    /// rows in place, and flash attention over contiguous keys. Returns whether it ran.
    #[allow(clippy::too_many_arguments)]
    fn fused_projection(
        &self,
        layer: usize,
        kv: &mut GpuSequenceKv,
        x: &GpuAct,
        m: [&Matrix; 3],
        out: &mut GpuAct,
        positions: &[usize],
        rope: &RopeParams,
    ) -> Result<bool, ModelError> {
        let t = x.rows;
        let c = &self.cpu.config;
        if self.pass.mode.get() != Mode::Normal
            || !self.routes.fused_qkv_store
            || routes::attention_route(t, self.routes.deterministic) != AttentionRoute::Flash
            || rope.n_rot < 2
            || !rope.n_rot.is_multiple_of(2)
            || rope.n_rot > c.head_dim
        {
            return Ok(false);
        }
        let gs = [self.matrix(m[0])?, self.matrix(m[1])?, self.matrix(m[2])?];
        let Some(w16) = self.stacked_route(&m, &gs, t) else {
            return Ok(false);
        };
        let lc = &kv.layers[layer];
        let window = lc.window;
        if routes::kv_route(&lc.placement, t, window) != KvRoute::InPlace {
            return Ok(false);
        }
        let (dst, after) = routes::store_rows(&lc.placement, t);
        let source = (after.capacity, after.origin_logical, after.origin_physical);
        let Some(keys) = key_range(positions, window, source) else {
            return Ok(false);
        };
        let total: usize = m.iter().map(|mm| mm.rows).sum();
        let mut all = self.act(t, total)?;
        self.profiled(format_args!("gemm q+k+v stacked {total}x{}, t={t}", x.width), || {
            self.gemm_into_act(&w16, x, &mut all)
        })?;
        let (dst, pos) = (self.param_ints(dst)?, self.param(positions, "position")?);
        let mut q = self.act(t, c.q_width())?;
        let shape = RopeStoreShape {
            rows: t,
            n_head: c.n_head,
            n_kv_head: c.n_kv_head,
            head_dim: c.head_dim,
            rope: *rope,
        };
        let lc = &mut kv.layers[layer];
        self.profiled("split + rope + kv_store", || {
            let bufs = SplitRopeStoreBuffers {
                qkv: all.buf()?.as_view(),
                q: q.buf_mut()?.as_view_mut(),
                kc: lc.k.as_view_mut(),
                vc: lc.v.as_view_mut(),
                dst: self.view(&dst),
                pos: self.view(&pos),
            };
            split_rope_kv_store_into(&self.gpu, &shape, bufs)
        })?;
        lc.placement = after;
        let rows = 0..t;
        self.profiled("attend (flash)", || {
            self.attend_flash(&q, out, &rows, &lc.k, &lc.v, keys, positions, window)
        })?;
        Ok(true)
    }
}
