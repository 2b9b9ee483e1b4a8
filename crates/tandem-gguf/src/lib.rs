//! GGUF, the model file format of llama.cpp: a validating, memory-mapped, zero-copy reader and a writer.
//!
//! Layout of a file (all little-endian):
//! `magic "GGUF" | version u32 | tensor_count u64 | kv_count u64 | kv pairs | tensor infos | padding | data`.
//! A kv pair is `string key | u32 value type | value`; a tensor info is
//! `string name | u32 n_dims | u64 dims[n_dims] | u32 ggml type | u64 offset` (offset relative to the data
//! section, which starts at the next multiple of `general.alignment`, default 32).
//!
//! The reader trusts nothing: every count, length, offset and shape is checked against the file's size
//! before it is used, and errors name the field or tensor and the byte offset where reading failed.

mod error;
mod reader;
mod tensor_type;
mod value;
mod writer;

pub use error::{GgufError, Result};
pub use reader::{GgufFile, TensorInfo, DEFAULT_ALIGNMENT, MAX_DIMS};
pub use tensor_type::GgmlType;
pub use value::{Array, Value, ValueType};
pub use writer::{GgufWriter, TensorSink};
