//! The serving engine's `ServingBackend` for `CudaModel`: the KV budget and per-sequence caches, and
//! the traffic of experts kept in host memory.

use tandem_model::{ExpertTraffic, KvSizing, ServingBackend};

use crate::model::CudaModel;

impl ServingBackend for CudaModel {
    fn set_kv_budget(&mut self, bytes: usize) {
        self.gpu.kv_ledger.set_budget(Some(bytes));
    }

    fn set_ring_slack(&mut self, rows: usize) {
        self.cpu.ring_slack = rows;
    }

    /// Device caches are allocated whole when the sequence is made, whatever its length.
    fn kv_sizing(&self, n_ctx: usize) -> KvSizing {
        KvSizing::new(&self.cpu.config, n_ctx, self.cpu.ring_slack, None)
    }

    fn kv_bytes_in_use(&self) -> usize {
        self.gpu.kv_ledger.in_use()
    }

    fn expert_traffic(&self) -> Option<ExpertTraffic> {
        self.expert_counters().map(|c| ExpertTraffic {
            cache_hits: c.cache_hits,
            cache_copies: c.cache_copies,
            cpu_experts: c.cpu_experts,
            stream_copies: c.stream_copies,
            stream_skips: c.stream_skips,
            bytes: c.bytes,
        })
    }
}
