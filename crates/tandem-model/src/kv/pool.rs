//! The KV block pool: every layer cache of every sequence takes its storage from here, in blocks of
//! `BLOCK_ROWS` rows of K and V, and gives it back when the sequence ends. The pool's byte budget is the
//! hard cap on KV memory; freed blocks are kept and reused rather than returned to the allocator.

use std::sync::{Arc, Mutex};

use half::f16;

use crate::ModelError;

/// Rows per block: storage grows in these steps, so a short conversation does not pay for the context.
pub const BLOCK_ROWS: usize = 256;

/// `BLOCK_ROWS` rows of K and of V.
pub struct Block {
    pub(super) k: Box<[f16]>,
    pub(super) v: Box<[f16]>,
}

pub struct KvPool {
    /// Values per row (KV heads × head dim).
    width: usize,
    budget_blocks: Option<usize>,
    state: Mutex<PoolState>,
}

#[derive(Default)]
struct PoolState {
    free: Vec<Block>,
    /// Blocks handed out and not yet returned.
    in_use: usize,
}

impl KvPool {
    /// A pool for rows of `width` values; `budget_bytes` caps K and V together (`None`: no cap).
    pub fn new(width: usize, budget_bytes: Option<usize>) -> Arc<Self> {
        let block_bytes = BLOCK_ROWS * width * 2 * 2;
        Arc::new(KvPool {
            width,
            budget_blocks: budget_bytes.map(|b| b / block_bytes.max(1)),
            state: Mutex::new(PoolState::default()),
        })
    }

    pub fn width(&self) -> usize {
        self.width
    }

    pub fn block_bytes(&self) -> usize {
        BLOCK_ROWS * self.width * 2 * 2
    }

    fn state(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A block, reused when one is free; an error when the budget is spent.
    pub fn take(&self) -> Result<Block, ModelError> {
        let mut st = self.state();
        if self.budget_blocks.is_some_and(|max| st.in_use >= max) {
            return Err(ModelError::KvFull {
                budget_bytes: self.budget_bytes().unwrap_or(0),
            });
        }
        st.in_use += 1;
        Ok(st.free.pop().unwrap_or_else(|| Block {
            k: vec![f16::ZERO; BLOCK_ROWS * self.width].into_boxed_slice(),
            v: vec![f16::ZERO; BLOCK_ROWS * self.width].into_boxed_slice(),
        }))
    }

    pub fn give(&self, blocks: impl IntoIterator<Item = Block>) {
        let mut st = self.state();
        for b in blocks {
            st.in_use -= 1;
            st.free.push(b);
        }
    }

    /// Bytes of blocks handed out now.
    pub fn bytes_in_use(&self) -> usize {
        self.state().in_use * self.block_bytes()
    }

    pub fn budget_bytes(&self) -> Option<usize> {
        self.budget_blocks.map(|b| b * self.block_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_counted_capped_and_reused() {
        let pool = KvPool::new(4, Some(3 * BLOCK_ROWS * 4 * 4));
        let a = pool.take().unwrap();
        let b = pool.take().unwrap();
        let _c = pool.take().unwrap();
        assert!(
            matches!(pool.take(), Err(ModelError::KvFull { .. })),
            "the budget is three blocks"
        );
        assert_eq!(pool.bytes_in_use(), 3 * pool.block_bytes());
        let a_ptr = a.k.as_ptr();
        pool.give([a, b]);
        assert_eq!(pool.bytes_in_use(), pool.block_bytes());
        let again = pool.take().unwrap();
        let again2 = pool.take().unwrap();
        assert!(
            again.k.as_ptr() == a_ptr || again2.k.as_ptr() == a_ptr,
            "freed blocks are reused"
        );
    }
}
