//! Device buffers recycled by length. A decode step asks for the same sizes in the same order every
//! time, so with a pool it gets the same addresses every time: what a captured CUDA graph needs (its
//! kernels keep the pointers they were captured with). The pool never frees; it holds at most what
//! the largest forward pass used at once.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::rc::Rc;

use cudarc::driver::{CudaSlice, DeviceRepr};

use crate::runtime::device::Gpu;
use crate::CudaError;

pub struct BufPool<T> {
    free: RefCell<HashMap<usize, Vec<CudaSlice<T>>>>,
}

impl<T> Default for BufPool<T> {
    fn default() -> Self {
        BufPool {
            free: RefCell::new(HashMap::new()),
        }
    }
}

/// A pooled buffer: a `CudaSlice` that goes back to its pool when dropped.
pub struct DevBuf<T> {
    slice: Option<CudaSlice<T>>,
    pool: Rc<BufPool<T>>,
}

impl<T: DeviceRepr> BufPool<T> {
    /// A buffer of exactly `n` elements, contents unspecified: a free one of that length, else a new
    /// one (refused when `may_allocate` is false, as during graph capture).
    pub fn take(self: &Rc<Self>, gpu: &Gpu, n: usize, may_allocate: bool) -> Result<DevBuf<T>, CudaError> {
        let n = n.max(1);
        let reused = self.free.borrow_mut().get_mut(&n).and_then(Vec::pop);
        let slice = match reused {
            Some(s) => s,
            None if may_allocate => gpu.alloc_out::<T>(n)?,
            None => {
                return Err(CudaError::Driver {
                    what: "graph capture".into(),
                    err: format!("no pooled buffer of {n} elements (capture allocates nothing)"),
                })
            }
        };
        Ok(DevBuf {
            slice: Some(slice),
            pool: Rc::clone(self),
        })
    }
}

impl<T> Deref for DevBuf<T> {
    type Target = CudaSlice<T>;
    fn deref(&self) -> &CudaSlice<T> {
        self.slice.as_ref().expect("a DevBuf holds its slice until dropped")
    }
}

impl<T> DerefMut for DevBuf<T> {
    fn deref_mut(&mut self) -> &mut CudaSlice<T> {
        self.slice.as_mut().expect("a DevBuf holds its slice until dropped")
    }
}

impl<T> Drop for DevBuf<T> {
    fn drop(&mut self) {
        if let Some(s) = self.slice.take() {
            self.pool.free.borrow_mut().entry(s.len()).or_default().push(s);
        }
    }
}
