//! Weights on the device: each matrix's quantized bytes, its f16 copy for the GEMM route, the
//! decode kernel chosen for its shape, and the stacked operands of matrices reading one input.

use std::collections::HashMap;
use std::ops::Range;
use std::rc::Rc;

use cudarc::driver::{CudaSlice, CudaView};

use crate::matmul::indexed::ExpertTable;
use crate::matmul::kinds::DecodeKernel;
use crate::routes;
use crate::CudaError;

pub(crate) struct GpuMatrix {
    pub(crate) suffix: &'static str,
    /// The quantized weights, in the layout `decode` reads (the ggml layout unless `Int8` repacked them).
    pub(crate) quantized: WeightBytes,
    /// The GEMM route's operand (absent in deterministic mode and for the embedding table).
    pub(crate) f16: Option<F16Weights>,
    /// The matvec-route kernel measured fastest for this shape (used for every row count).
    pub(crate) decode: DecodeKernel,
    /// Whether cuBLAS over the f16 copy beat every matvec for one row (not in deterministic mode).
    pub(crate) decode_cublas: bool,
    /// The route of each decode batch of 2 to `routes::BATCH_TUNED_MAX_ROWS` rows, measured at load
    /// (`tune::batch_routes`; all the matvec in deterministic mode).
    pub(crate) batch: routes::BatchRoutes,
    /// The ggml-layout rows the embedding kernel reads, kept beside `quantized` when that was
    /// repacked for the integer route: an embedding table that is also the output projection.
    pub(crate) embed_rows: Option<CudaSlice<u8>>,
}

impl GpuMatrix {
    /// The rows `embed_*` kernels read (the ggml layout).
    pub(crate) fn embedding_rows(&self) -> CudaView<'_, u8> {
        match &self.embed_rows {
            Some(rows) => rows.as_view(),
            None => self.quantized.view(),
        }
    }
}

/// Where a matrix's uploaded weights live.
pub(crate) enum WeightBytes {
    /// An allocation of its own.
    Own(CudaSlice<u8>),
    /// Bytes `range` of an allocation shared with the other matrices reading the same input: an F16
    /// file's q, k and v (gate and up), whose weights are also their GEMM operand, stacked so that one
    /// GEMM makes all their products (`stack_input_groups`).
    Part(Rc<CudaSlice<u8>>, Range<usize>),
    /// An allocation shared by the matrices that take turns in it: a streaming slot, which holds an
    /// expert of whichever layer was last copied in (`offload::slots`), read as each weight type that
    /// passes through it.
    Shared(Rc<CudaSlice<u8>>),
}

impl WeightBytes {
    pub(crate) fn view(&self) -> CudaView<'_, u8> {
        match self {
            WeightBytes::Own(w) => w.as_view(),
            WeightBytes::Part(all, range) => all.slice(range.clone()),
            WeightBytes::Shared(w) => w.as_view(),
        }
    }

    /// The allocation the integer kernels read: always their own, since only F16 weights, which have
    /// no integer route, are stacked.
    pub(crate) fn own(&self) -> Result<&CudaSlice<u8>, CudaError> {
        match self {
            WeightBytes::Own(w) => Ok(w),
            WeightBytes::Shared(w) => Ok(w),
            WeightBytes::Part(..) => Err(CudaError::Driver {
                what: "integer-route weights".into(),
                err: "stacked weights have no integer route".into(),
            }),
        }
    }
}

/// Where a matrix's f16 GEMM operand lives.
pub(crate) enum F16Weights {
    /// A copy dequantized at load.
    Copy(CudaSlice<u16>),
    /// The uploaded weights themselves: an F16 file's ggml layout already is the operand (row-major
    /// f16), so a copy would only double its memory.
    Original,
    /// Rows `range` (in f16 elements) of a copy shared with the other matrices reading the same input
    /// (q, k and v; gate and up), in their order, so that one GEMM can make all their products
    /// (`stack_input_groups`).
    Stacked(Rc<CudaSlice<u16>>, Range<usize>),
}

impl F16Weights {
    /// The operand, given the matrix's uploaded ggml-layout weights.
    pub(crate) fn view<'a>(&'a self, original: CudaView<'a, u8>) -> Result<CudaView<'a, u16>, CudaError> {
        match self {
            F16Weights::Copy(w16) => Ok(w16.as_view()),
            F16Weights::Stacked(w16, range) => Ok(w16.slice(range.clone())),
            F16Weights::Original => f16_of_bytes(original),
        }
    }
}

impl GpuMatrix {
    /// The GEMM route's operand, when this matrix has one.
    pub(crate) fn f16_view(&self) -> Result<Option<CudaView<'_, u16>>, CudaError> {
        self.f16.as_ref().map(|f| f.view(self.quantized.view())).transpose()
    }
}

/// F16 weights' bytes as their f16 values.
fn f16_of_bytes(bytes: CudaView<'_, u8>) -> Result<CudaView<'_, u16>, CudaError> {
    // SAFETY: only F16 weights are viewed so: `len / 2` f16 values from an even offset of a device
    // allocation (every matrix's byte count is even, and allocations are aligned for any type).
    unsafe { bytes.transmute::<u16>(bytes.len() / 2) }.ok_or_else(|| CudaError::Driver {
        what: "f16 weights".into(),
        err: "buffer too small for its f16 view".into(),
    })
}

/// The model's weights on the device (`CudaModel::weights`), made by `CudaModel::load`.
pub struct DeviceWeights {
    pub(crate) matrices: HashMap<String, GpuMatrix>,
    pub(crate) norms: HashMap<String, CudaSlice<f32>>,
    /// Pre-norm name to the matrices reading its output (the first one's kernel says how to quantize
    /// it; when all take the GEMM route, only their f16 operand is made).
    pub(crate) norm_readers: HashMap<String, Vec<String>>,
    /// A mixture's expert tensors (by `ExpertMatrices::name`) whose experts all take one integer
    /// kernel: their address tables for the routed products of decode (`matmul::indexed`).
    pub(crate) expert_tables: HashMap<String, ExpertTable>,
    pub memory: GpuMemory,
}

/// Device memory by purpose, for `--verbose`.
#[derive(Clone, Copy, Debug, Default)]
pub struct GpuMemory {
    pub weights_quantized: usize,
    /// The integer-route copy of an embedding table that is also the output projection (the
    /// embedding kernel keeps reading the original rows).
    pub tied_output_int8: usize,
    pub weights_f16: usize,
    pub norms: usize,
    /// A mixture's experts beyond `--gpu-expert-budget`, in page-locked host memory (not device bytes).
    pub experts_host: usize,
    /// The device slots those experts pass through.
    pub expert_slots: usize,
}

/// The stacked f16 operand of `members` in order (`stack_input_groups`): one view over their
/// operands when they are adjacent runs of one allocation, first to last.
pub(crate) fn stacked_operand<'a>(members: &[&'a GpuMatrix]) -> Option<CudaView<'a, u16>> {
    let first = members.first()?;
    match (&first.f16, &first.quantized) {
        (Some(F16Weights::Stacked(all, _)), _) => {
            let span = adjacent_span(members.iter().map(|g| match &g.f16 {
                Some(F16Weights::Stacked(all, range)) => Some((Rc::as_ptr(all) as usize, range.clone())),
                _ => None,
            }))?;
            Some(all.slice(span))
        }
        (Some(F16Weights::Original), WeightBytes::Part(all, _)) => {
            let span = adjacent_span(members.iter().map(|g| match (&g.f16, &g.quantized) {
                (Some(F16Weights::Original), WeightBytes::Part(all, range)) => {
                    Some((Rc::as_ptr(all) as usize, range.clone()))
                }
                _ => None,
            }))?;
            f16_of_bytes(all.slice(span)).ok()
        }
        _ => None,
    }
}

/// The span `runs` (allocation, range) cover together when they are adjacent ranges of one
/// allocation, in order (`None` as well where a run is `None`).
fn adjacent_span(runs: impl IntoIterator<Item = Option<(usize, Range<usize>)>>) -> Option<Range<usize>> {
    let mut shared: Option<(usize, Range<usize>)> = None;
    for run in runs {
        let (id, range) = run?;
        shared = match shared {
            None => Some((id, range)),
            Some((first, span)) if first == id && span.end == range.start => Some((first, span.start..range.end)),
            Some(_) => return None,
        };
    }
    shared.map(|(_, span)| span)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_operand_spans_only_adjacent_runs_of_one_allocation_in_order() {
        let span = |runs: &[(usize, Range<usize>)]| adjacent_span(runs.iter().cloned().map(Some));
        assert_eq!(span(&[(1, 0..40), (1, 40..50), (1, 50..60)]), Some(0..60));
        assert_eq!(span(&[(1, 40..50), (1, 50..60)]), Some(40..60), "a tail of the stack");
        assert_eq!(span(&[(1, 0..40), (1, 50..60)]), None, "a gap");
        assert_eq!(span(&[(1, 40..50), (1, 0..40)]), None, "out of order");
        assert_eq!(span(&[(1, 0..40), (2, 40..50)]), None, "two allocations");
        assert_eq!(span(&[]), None);
        assert_eq!(
            adjacent_span([Some((1, 0..40)), None, Some((1, 40..50))]),
            None,
            "a member not stacked"
        );
    }
}
