//! Attention kernels and their launch shapes: the tile kernel with its KV store (`tile`), batched
//! decode rows through buffer tables (`rows`), and prefill on the tensor cores (`flash`).

pub mod flash;
pub mod rows;
pub mod tile;
