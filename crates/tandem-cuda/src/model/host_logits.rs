//! Logits lent from page-locked buffers (`cache/host_logits.rs`): a decode graph's step and a
//! batched step's rows.

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use tandem_model::Logits;

use crate::cache::host_logits::LentHost;
use crate::cache::host_logits::LentRows;
use crate::cache::host_logits::SharedHost;
use crate::model::CudaModel;
use crate::CudaError;

impl CudaModel {
    /// The graph's logits of the step just launched, copied into a page-locked buffer from the pool
    /// once the GPU is done, and lent out.
    pub(crate) fn lend_logits(&self, out: &CudaSlice<f32>) -> Result<Logits, CudaError> {
        let mut host = self.buffers.pinned_logits.take(out.len())?;
        let n = match host.download(&self.gpu, out) {
            Ok(n) => n,
            Err(e) => {
                self.buffers.pinned_logits.give_back(host);
                return Err(e);
            }
        };
        Ok(Logits::lent(Box::new(LentHost {
            host: Some(host),
            n,
            pool: self.buffers.pinned_logits.clone(),
        })))
    }
}

impl CudaModel {
    /// A pass's logits (`rows[i]` rows for span i, in order) copied into one page-locked buffer from
    /// the pool once the GPU is done; each span is lent its rows.
    pub(crate) fn lend_logit_rows(&self, out: &CudaSlice<f32>, rows: &[usize]) -> Result<Vec<Logits>, CudaError> {
        let total: usize = rows.iter().sum();
        let n_vocab = out.len().checked_div(total).unwrap_or(0);
        let mut host = self.buffers.pinned_logits.take(out.len())?;
        if let Err(e) = host.download(&self.gpu, out) {
            self.buffers.pinned_logits.give_back(host);
            return Err(e);
        }
        let shared = Arc::new(SharedHost {
            host: Some(host),
            pool: self.buffers.pinned_logits.clone(),
        });
        let mut start = 0;
        Ok(rows
            .iter()
            .map(|&n| {
                let range = start..start + n * n_vocab;
                start = range.end;
                Logits::lent(Box::new(LentRows {
                    shared: Arc::clone(&shared),
                    range,
                }))
            })
            .collect())
    }
}
