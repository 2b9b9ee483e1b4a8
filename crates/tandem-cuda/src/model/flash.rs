//! The model's side of flash attention (`attention/flash.rs`): a plan per span of the pass.

use std::ops::Range;
use std::rc::Rc;

use cudarc::driver::CudaSlice;

use crate::attention::flash::chosen;
use crate::attention::flash::flash_attention_into;
use crate::attention::flash::plan;
use crate::attention::flash::FlashShape;
use crate::attention::flash::FlashVariant;
use crate::attention::flash::KeyRange;
use crate::model::{CudaModel, GpuAct};
use crate::CudaError;

impl CudaModel {
    /// The plan of this pass's span at `positions` for `keys`, `window` and variant `v`: made and
    /// uploaded by the first layer that asks, reused by the others (the memo is cleared when the next
    /// pass embeds its tokens).
    fn flash_plan(
        &self,
        positions: &[usize],
        window: Option<usize>,
        keys: KeyRange,
        v: FlashVariant,
    ) -> Result<Rc<CudaSlice<i32>>, CudaError> {
        let found = self.pass.plans.borrow().iter().find_map(|((p, w, k, kv), plan)| {
            (p == positions && *w == window && *k == keys && *kv == v).then(|| Rc::clone(plan))
        });
        if let Some(p) = found {
            return Ok(p);
        }
        let p = Rc::new(
            self.gpu
                .upload(&plan(positions, window, keys, (v.query_tile(), v.key_tile)))?,
        );
        self.pass
            .plans
            .borrow_mut()
            .push(((positions.to_vec(), window, keys, v), Rc::clone(&p)));
        Ok(p)
    }

    /// Attention of `rows` of `io` over keys `keys` of `kc`/`vc` on the flash route.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attend_flash(
        &self,
        q: &GpuAct,
        out: &mut GpuAct,
        rows: &Range<usize>,
        kc: &CudaSlice<u16>,
        vc: &CudaSlice<u16>,
        keys: KeyRange,
        positions: &[usize],
        window: Option<usize>,
    ) -> Result<(), CudaError> {
        let c = &self.cpu.config;
        let (qw, kvw) = (c.q_width(), c.kv_width());
        let variant =
            chosen(c.head_dim, rows.len(), self.gpu.major).ok_or(CudaError::UnsupportedHeadDim(c.head_dim))?;
        let plan = self.flash_plan(positions, window, keys, variant)?;
        let pos = self.param(positions, "position")?;
        let shape = FlashShape {
            t: rows.len(),
            keys,
            window,
            n_head: c.n_head,
            n_kv_head: c.n_kv_head,
            head_dim: c.head_dim,
            scale: c.attn_scale,
        };
        let key_rows = keys.phys * kvw..(keys.phys + keys.n) * kvw;
        let q = q.buf()?.slice(rows.start * qw..rows.end * qw);
        let mut out = out.buf_mut()?.slice_mut(rows.start * qw..rows.end * qw);
        flash_attention_into(
            &self.gpu,
            variant,
            shape,
            &q,
            &kc.slice(key_rows.clone()),
            &vc.slice(key_rows),
            &self.view(&pos),
            &plan.as_view(),
            &mut out,
        )
    }
}
