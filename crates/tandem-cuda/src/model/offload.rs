//! The model's side of experts beyond `--gpu-expert-budget` (`crate::offload` holds the parts): where
//! a non-resident expert is read from in a layer of the grouped route, and the stream of a long
//! prefill chunk from its first mixture layer to its last.
//!
//! A chunk of `STREAM_MIN_ROWS` rows or more (in a pass launched now, `--expert-stream` not `off`)
//! starts its stream at the first mixture layer: the issuer thread copies every non-resident expert
//! of every layer through the slot ring as room allows. At each layer the compute thread publishes the
//! routing (so the issuer skips what no row routes to, in `routed` mode), takes each routed
//! non-resident expert from its slot once its copy lands, and releases it; after the last mixture
//! layer it joins the issuer. Shorter chunks and decode steps stage each routed non-resident expert in
//! a slot on the compute stream (the slot cache). Either way an expert runs through the same ops and
//! kernels from its slot as a resident one would, so the logits are the same bits at any budget, mode
//! and depth wherever the products are row-exact (deterministic mode).

use tandem_model::moe::ExpertRows;
use tandem_model::weights::Matrix;
use tandem_model::ModelError;

use crate::model::{CudaModel, Mode};
use crate::offload::stream::ActiveStream;

/// A non-resident expert in its slot: its stream entry (when streamed) and its gate, up and down
/// under the slot's matrix names.
pub(crate) struct InSlot {
    pub(crate) entry: Option<usize>,
    pub(crate) matrices: [Matrix; 3],
}

impl CudaModel {
    /// Whether `layer`'s non-resident experts come from the chunk's stream. At the first mixture
    /// layer, a stream a failed pass left is ended and a chunk of `rows` rows starts one where it
    /// streams; then this layer's routing (`groups`) is published to the issuer.
    pub(crate) fn expert_stream(&self, layer: usize, rows: usize, groups: &[ExpertRows]) -> Result<bool, ModelError> {
        let Some(o) = &self.offload else {
            return Ok(false);
        };
        if layer == o.first_layer {
            if let Some(left) = o.active.borrow_mut().take() {
                drop(left);
                o.slots.forget();
            }
            let walk = o.options.stream.walk_for_rows(rows);
            if let (Some(mode), Mode::Normal) = (walk, self.pass.mode.get()) {
                let s = ActiveStream::start(
                    &self.gpu,
                    &o.ring,
                    &o.slots,
                    &o.host,
                    &o.residency,
                    o.n_layers,
                    mode,
                    o.options.depth,
                    rows,
                )?;
                o.slots.forget();
                *o.active.borrow_mut() = Some(s);
            }
        }
        let active = o.active.borrow();
        let Some(s) = active.as_ref() else {
            return Ok(false);
        };
        if s.rows != rows {
            return Err(ModelError::Kernel(format!(
                "expert stream of a {}-row chunk met a {rows}-row layer",
                s.rows
            )));
        }
        let mut counts = vec![0u32; o.residency.n_expert()];
        for g in groups {
            if let Some(c) = counts.get_mut(g.expert) {
                *c = u32::try_from(g.pairs.len()).unwrap_or(u32::MAX);
            }
        }
        s.chunk()
            .publish_counts(layer, &counts)
            .map_err(|e| ModelError::Kernel(format!("expert stream: {e}")))?;
        Ok(true)
    }

    /// Where `layer`'s `expert` (`matrices`: its gate, up and down) is read from: `None` when
    /// resident; else its stream entry (when `streamed`) and the matrices under its slot's names, the
    /// compute stream ordered after the bytes land.
    pub(crate) fn place_expert(
        &self,
        layer: usize,
        expert: usize,
        matrices: &[&Matrix; 3],
        streamed: bool,
    ) -> Result<Option<InSlot>, ModelError> {
        let Some(o) = &self.offload else {
            return Ok(None);
        };
        if o.residency.is_resident(layer, expert) {
            return Ok(None);
        }
        let (entry, slot) = if streamed {
            let active = o.active.borrow();
            let s = active
                .as_ref()
                .ok_or_else(|| ModelError::Kernel("a streamed layer without its stream".into()))?;
            let k = s
                .entry(layer, expert)
                .ok_or_else(|| ModelError::Kernel(format!("layer {layer} expert {expert} is not in the stream")))?;
            (Some(k), s.acquire(&self.gpu.stream, k)?)
        } else {
            (None, o.slots.stage(&self.gpu, &o.host, layer, expert)?)
        };
        let [g, u, d] = [0, 1, 2].map(|p| o.slot_matrix(slot, p, matrices[p]));
        Ok(Some(InSlot {
            entry,
            matrices: [g?, u?, d?],
        }))
    }

    /// After a streamed layer's experts: its entries released; after the last mixture layer, the
    /// stream finished (its copies ordered before later work on the slots) and traced.
    pub(crate) fn end_layer_stream(&self, layer: usize) -> Result<(), ModelError> {
        let Some(o) = &self.offload else {
            return Ok(());
        };
        if layer != o.last_layer {
            if let Some(s) = o.active.borrow().as_ref() {
                s.chunk().release_through(s.chunk().plan().layer_entries(layer).end);
            }
            return Ok(());
        }
        let Some(s) = o.active.borrow_mut().take() else {
            return Ok(());
        };
        let rows = s.rows;
        let (stats, elapsed) = s.finish(&self.gpu.stream)?;
        o.slots.count_stream(stats.copied, stats.skipped, stats.bytes);
        o.slots.forget();
        if o.options.trace {
            eprintln!("{}", stats.trace_line(rows, elapsed));
        }
        Ok(())
    }
}
