//! The validating reader. Parsing walks a bounds-checked cursor over the whole file; nothing is
//! allocated from a count until the bytes that count implies are known to exist.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use crate::error::{GgufError, Result};
use crate::value::{Array, Value, ValueType};
use crate::GgmlType;

pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most four dimensions.
pub const MAX_DIMS: u32 = 4;
/// Arrays of arrays deeper than this are refused (a hostile file could otherwise recurse without end).
const MAX_ARRAY_DEPTH: u32 = 8;

/// Where a tensor's bytes are and what they hold.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the row length (contiguous), `dims[1]` the number of rows, …
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset from the start of the data section.
    pub offset: u64,
    /// Bytes of data, derived from the type and dims.
    pub size: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Number of rows: the product of every dim after the first.
    pub fn n_rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }

    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }
}

enum Backing {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mapped(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// A parsed GGUF file. Tensor data is borrowed from the mapping, never copied.
pub struct GgufFile {
    backing: Backing,
    path: Option<PathBuf>,
    pub version: u32,
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_offset: u64,
    metadata: Vec<(String, Value)>,
    metadata_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Maps and parses a file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let io_err = |error| GgufError::Io {
            path: path.to_path_buf(),
            error,
        };
        let file = File::open(path).map_err(io_err)?;
        // SAFETY: the mapping is read-only and private to this process; a file truncated underneath us by
        // another process is the one hazard memory maps carry, the same one llama.cpp accepts.
        let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(io_err)?;
        let mut parsed = Self::parse(Backing::Mapped(mmap)).map_err(|e| GgufError::InFile {
            path: path.to_path_buf(),
            inner: Box::new(e),
        })?;
        parsed.path = Some(path.to_path_buf());
        Ok(parsed)
    }

    /// Parses a file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        Self::parse(Backing::Owned(bytes))
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        self.backing.bytes()
    }

    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata_index.get(key).map(|&i| &self.metadata[i].1)
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The bytes of a tensor (validated at parse time to lie inside the file).
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let start = (self.data_offset + info.offset) as usize;
        &self.bytes()[start..start + info.size as usize]
    }

    /// A tensor by name, with its bytes, or an error naming it.
    pub fn tensor(&self, name: &str) -> Result<(&TensorInfo, &[u8])> {
        let info = self.tensor_info(name).ok_or_else(|| GgufError::Tensor {
            name: name.to_string(),
            reason: "not in the file".into(),
        })?;
        Ok((info, self.tensor_data(info)))
    }

    fn type_error(&self, key: &str, expected: &str) -> GgufError {
        let found = self.get(key).map(|v| v.value_type().to_string()).unwrap_or_default();
        GgufError::Metadata {
            key: key.to_string(),
            reason: format!("expected {expected}, found {found}"),
        }
    }

    /// An unsigned integer key of any width; `Ok(None)` when absent, an error when of another type.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.type_error(key, "a non-negative integer")),
        }
    }

    pub fn get_f32(&self, key: &str) -> Result<Option<f32>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(|x| Some(x as f32))
                .ok_or_else(|| self.type_error(key, "a number")),
        }
    }

    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| self.type_error(key, "a string")),
        }
    }

    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| self.type_error(key, "a bool")),
        }
    }

    pub fn get_array(&self, key: &str) -> Result<Option<&Array>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_array().map(Some).ok_or_else(|| self.type_error(key, "an array")),
        }
    }

    /// A required key, with an error naming it when missing.
    pub fn require<T>(&self, key: &str, got: Result<Option<T>>) -> Result<T> {
        got?.ok_or_else(|| GgufError::Metadata {
            key: key.to_string(),
            reason: "missing".into(),
        })
    }

    /// `general.architecture`, which every model file carries.
    pub fn architecture(&self) -> Result<&str> {
        self.require("general.architecture", self.get_str("general.architecture"))
    }

    fn parse(backing: Backing) -> Result<Self> {
        let bytes = backing.bytes();
        let mut cur = Cursor { bytes, pos: 0 };
        let magic = cur.take(4, "magic")?;
        if magic != GGUF_MAGIC {
            return Err(malformed("magic", 0, format!("expected \"GGUF\", found {magic:02x?}")));
        }
        let version = cur.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(malformed(
                "version",
                4,
                format!("version {version} is not supported (2 and 3 are)"),
            ));
        }
        let tensor_count = cur.u64("tensor_count")?;
        let kv_count = cur.u64("kv_count")?;
        // Each kv pair is at least a key length, a value type and one byte; bound before reserving.
        cur.check_count(kv_count, 13, "kv_count")?;

        let mut metadata = Vec::with_capacity(kv_count as usize);
        let mut metadata_index = HashMap::with_capacity(kv_count as usize);
        for i in 0..kv_count {
            let key_at = cur.pos as u64;
            let key = cur.string(&format!("metadata key #{i}"))?;
            let what = format!("metadata value of {key:?}");
            let type_at = cur.pos as u64;
            let type_id = cur.u32(&what)?;
            let ty = ValueType::from_id(type_id)
                .ok_or_else(|| malformed(&what, type_at, format!("unknown value type {type_id}")))?;
            let value = cur.value(ty, &what, 0)?;
            if metadata_index.insert(key.clone(), metadata.len()).is_some() {
                return Err(malformed(
                    &format!("metadata key {key:?}"),
                    key_at,
                    "duplicate key".into(),
                ));
            }
            metadata.push((key, value));
        }

        let alignment = match metadata_index.get("general.alignment").map(|&i| &metadata[i].1) {
            None => DEFAULT_ALIGNMENT,
            Some(Value::U32(a)) if *a != 0 && a.is_power_of_two() => *a as u64,
            Some(other) => {
                return Err(GgufError::Metadata {
                    key: "general.alignment".into(),
                    reason: format!("must be a power-of-two u32, found {}", other.summary(4)),
                })
            }
        };

        // A tensor info is at least a name length, a dim count, one dim, a type and an offset.
        cur.check_count(tensor_count, 8 + 4 + 8 + 4 + 8, "tensor_count")?;
        let mut infos = Vec::with_capacity(tensor_count as usize);
        let mut tensor_index = HashMap::with_capacity(tensor_count as usize);
        for i in 0..tensor_count {
            let start = cur.pos as u64;
            let info = cur.tensor_info(i, alignment)?;
            if tensor_index.insert(info.name.clone(), infos.len()).is_some() {
                return Err(malformed(
                    &format!("tensor {:?}", info.name),
                    start,
                    "duplicate tensor name".into(),
                ));
            }
            infos.push(info);
        }

        let data_offset = align_up(cur.pos as u64, alignment)
            .filter(|&o| o <= bytes.len() as u64 || infos.is_empty())
            .ok_or_else(|| {
                malformed(
                    "data section",
                    cur.pos as u64,
                    "file ends before the data section".into(),
                )
            })?;
        let data_len = (bytes.len() as u64).saturating_sub(data_offset);
        check_tensor_extents(&infos, data_offset, data_len)?;

        Ok(GgufFile {
            backing,
            path: None,
            version,
            alignment,
            data_offset,
            metadata,
            metadata_index,
            tensors: infos,
            tensor_index,
        })
    }
}

/// Every tensor must lie inside the data section, and no two may overlap.
fn check_tensor_extents(infos: &[TensorInfo], data_offset: u64, data_len: u64) -> Result<()> {
    for t in infos {
        let end = t.offset.checked_add(t.size);
        if end.is_none_or(|e| e > data_len) {
            return Err(GgufError::Tensor {
                name: t.name.clone(),
                reason: format!(
                    "data at file bytes {}..{} runs past the end of the file ({} bytes)",
                    data_offset.saturating_add(t.offset),
                    data_offset.saturating_add(t.offset).saturating_add(t.size),
                    data_offset + data_len
                ),
            });
        }
    }
    let mut by_offset: Vec<&TensorInfo> = infos.iter().collect();
    by_offset.sort_by_key(|t| t.offset);
    for pair in by_offset.windows(2) {
        if pair[0].offset + pair[0].size > pair[1].offset {
            return Err(GgufError::Tensor {
                name: pair[1].name.clone(),
                reason: format!("data overlaps tensor {:?}", pair[0].name),
            });
        }
    }
    Ok(())
}

pub(crate) fn align_up(x: u64, alignment: u64) -> Option<u64> {
    Some(x.checked_add(alignment - 1)? / alignment * alignment)
}

fn malformed(what: &str, offset: u64, reason: String) -> GgufError {
    GgufError::Malformed {
        what: what.to_string(),
        offset,
        reason,
    }
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(malformed(
                what,
                self.pos as u64,
                format!("needs {n} bytes but the file has {} left", self.remaining()),
            ));
        }
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Refuses a count whose items, at `min_size` bytes each, could not fit in the rest of the file.
    fn check_count(&self, count: u64, min_size: u64, what: &str) -> Result<()> {
        let need = count.checked_mul(min_size);
        if need.is_none_or(|n| n > self.remaining() as u64) {
            return Err(malformed(
                what,
                self.pos as u64,
                format!("count {count} cannot fit in the {} bytes left", self.remaining()),
            ));
        }
        Ok(())
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let at = self.pos as u64;
        let len = self.u64(what)?;
        if len > self.remaining() as u64 {
            return Err(malformed(
                what,
                at,
                format!("string length {len} exceeds the {} bytes left", self.remaining()),
            ));
        }
        let raw = self.take(len as usize, what)?;
        String::from_utf8(raw.to_vec()).map_err(|e| malformed(what, at + 8, format!("string is not UTF-8: {e}")))
    }

    fn value(&mut self, ty: ValueType, what: &str, depth: u32) -> Result<Value> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(what)?[0]),
            ValueType::I8 => Value::I8(self.array::<1>(what)?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            ValueType::U32 => Value::U32(self.u32(what)?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            ValueType::U64 => Value::U64(self.u64(what)?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            ValueType::Bool => {
                let at = self.pos as u64;
                match self.array::<1>(what)?[0] {
                    0 => Value::Bool(false),
                    1 => Value::Bool(true),
                    b => return Err(malformed(what, at, format!("bool byte {b} is neither 0 nor 1"))),
                }
            }
            ValueType::String => Value::String(self.string(what)?),
            ValueType::Array => Value::Array(self.array_value(what, depth)?),
        })
    }

    fn array_value(&mut self, what: &str, depth: u32) -> Result<Array> {
        let at = self.pos as u64;
        if depth >= MAX_ARRAY_DEPTH {
            return Err(malformed(
                what,
                at,
                format!("arrays nested deeper than {MAX_ARRAY_DEPTH}"),
            ));
        }
        let type_id = self.u32(what)?;
        let ty = ValueType::from_id(type_id)
            .ok_or_else(|| malformed(what, at, format!("unknown array element type {type_id}")))?;
        let count = self.u64(what)?;
        self.check_count(count, ty.min_encoded_size(), what)?;
        let n = count as usize;

        macro_rules! items {
            ($variant:ident, $read:expr) => {{
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push($read);
                }
                Array::$variant(items)
            }};
        }
        Ok(match ty {
            ValueType::U8 => Array::U8(self.take(n, what)?.to_vec()),
            ValueType::I8 => Array::I8(self.take(n, what)?.iter().map(|&b| b as i8).collect()),
            ValueType::U16 => items!(U16, u16::from_le_bytes(self.array(what)?)),
            ValueType::I16 => items!(I16, i16::from_le_bytes(self.array(what)?)),
            ValueType::U32 => items!(U32, self.u32(what)?),
            ValueType::I32 => items!(I32, i32::from_le_bytes(self.array(what)?)),
            ValueType::F32 => items!(F32, f32::from_le_bytes(self.array(what)?)),
            ValueType::U64 => items!(U64, self.u64(what)?),
            ValueType::I64 => items!(I64, i64::from_le_bytes(self.array(what)?)),
            ValueType::F64 => items!(F64, f64::from_le_bytes(self.array(what)?)),
            ValueType::Bool => items!(
                Bool,
                self.value(ValueType::Bool, what, depth)?.as_bool().unwrap_or(false)
            ),
            ValueType::String => items!(String, self.string(what)?),
            ValueType::Array => items!(Array, self.array_value(what, depth + 1)?),
        })
    }

    fn tensor_info(&mut self, index: u64, alignment: u64) -> Result<TensorInfo> {
        let name = self.string(&format!("tensor #{index} name"))?;
        let what = format!("tensor {name:?}");
        let dims_at = self.pos as u64;
        let n_dims = self.u32(&what)?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(malformed(
                &what,
                dims_at,
                format!("{n_dims} dimensions (1 to {MAX_DIMS} allowed)"),
            ));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(self.u64(&what)?);
        }
        let n_elements = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n < i64::MAX as u64);
        let n_elements = n_elements.ok_or_else(|| malformed(&what, dims_at, format!("shape {dims:?} overflows")))?;
        let type_at = self.pos as u64;
        let type_id = self.u32(&what)?;
        let ty = GgmlType::from_id(type_id)
            .ok_or_else(|| malformed(&what, type_at, format!("unknown tensor type {type_id}")))?;
        if dims[0] % ty.block_elems() as u64 != 0 {
            return Err(malformed(
                &what,
                dims_at,
                format!(
                    "row length {} is not a multiple of {}'s block of {}",
                    dims[0],
                    ty,
                    ty.block_elems()
                ),
            ));
        }
        let size = ty
            .row_bytes(n_elements)
            .ok_or_else(|| malformed(&what, dims_at, format!("shape {dims:?} of {ty} overflows")))?;
        let offset_at = self.pos as u64;
        let offset = self.u64(&what)?;
        if offset % alignment != 0 {
            return Err(malformed(
                &what,
                offset_at,
                format!("data offset {offset} is not a multiple of the alignment {alignment}"),
            ));
        }
        Ok(TensorInfo {
            name,
            dims,
            ty,
            offset,
            size,
        })
    }
}
