//! Matrix products: the shared kinds (`kinds`), the integer decode route (`int8`), decode batches on
//! the tensor cores (`qmma`, `dqmma`), routed experts' products by ids on the device (`indexed`),
//! the load-time timing that picks each shape's kernel and each batch size's route (`tune`), and
//! the weights on the device (`weights`).

pub mod dqmma;
pub mod indexed;
pub mod int8;
pub mod kinds;
pub mod qmma;
pub mod tune;
pub(crate) mod weights;
