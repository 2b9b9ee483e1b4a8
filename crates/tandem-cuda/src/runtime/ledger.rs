//! Device bytes of KV caches and checkpoints, and the serving budget that caps them.

use std::sync::{Arc, Mutex};

use crate::CudaError;

/// Device bytes held by KV caches and checkpoints, against an optional cap.
#[derive(Default)]
pub struct KvLedger {
    state: Mutex<LedgerState>,
}

#[derive(Default)]
struct LedgerState {
    budget: Option<usize>,
    in_use: usize,
}

impl KvLedger {
    fn state(&self) -> std::sync::MutexGuard<'_, LedgerState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Caps what later grants may bring the total to (`None`: no cap).
    pub fn set_budget(&self, bytes: Option<usize>) {
        self.state().budget = bytes;
    }

    pub fn in_use(&self) -> usize {
        self.state().in_use
    }

    /// Counts `bytes` until the grant is dropped; an error when they would pass the budget.
    pub fn grant(self: &Arc<Self>, bytes: usize) -> Result<KvGrant, CudaError> {
        let mut st = self.state();
        if let Some(budget) = st.budget {
            if st.in_use + bytes > budget {
                return Err(CudaError::KvFull {
                    budget_bytes: budget,
                    in_use: st.in_use,
                    need: bytes,
                });
            }
        }
        st.in_use += bytes;
        Ok(KvGrant {
            ledger: Arc::clone(self),
            bytes,
        })
    }
}

/// Bytes counted in a `KvLedger` while this lives.
pub struct KvGrant {
    pub(crate) ledger: Arc<KvLedger>,
    pub(crate) bytes: usize,
}

impl Drop for KvGrant {
    fn drop(&mut self) {
        self.ledger.state().in_use -= self.bytes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_model::ModelError;

    #[test]
    fn the_ledger_counts_caps_and_releases() {
        let ledger = Arc::new(KvLedger::default());
        let a = ledger.grant(600).unwrap();
        ledger.set_budget(Some(1000));
        let b = ledger.grant(400).unwrap();
        assert_eq!(ledger.in_use(), 1000);
        match ledger.grant(1) {
            Err(CudaError::KvFull {
                budget_bytes: 1000,
                in_use: 1000,
                need: 1,
            }) => {}
            other => panic!("expected KvFull, got {:?}", other.map(|g| g.bytes)),
        }
        drop(a);
        assert_eq!(ledger.in_use(), 400);
        let c = ledger.grant(600).unwrap();
        drop((b, c));
        assert_eq!(ledger.in_use(), 0);
        assert!(matches!(
            ModelError::from(ledger.grant(2000).map(|_| ()).unwrap_err()),
            ModelError::KvFull { budget_bytes: 1000 }
        ));
    }
}
