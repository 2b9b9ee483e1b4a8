//! The writer: declare metadata and tensors, write the header, then stream each tensor's bytes in
//! declaration order. Memory stays bounded by what the caller holds, so multi-GB files stream through.
//! Tensors are laid out in order, each padded to the alignment, as llama.cpp's own writer does; a file
//! read and re-written with the same declarations comes out byte for byte the same.

use std::io::Write;

use crate::error::{GgufError, Result};
use crate::reader::{align_up, GgufFile, TensorInfo, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS};
use crate::value::{Array, Value};
use crate::GgmlType;

#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<TensorInfo>,
    data_size: u64,
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Declares everything a parsed file holds, in its order.
    pub fn from_file(file: &GgufFile) -> Result<Self> {
        let mut w = Self::new();
        for (k, v) in file.metadata() {
            w.add_metadata(k, v.clone())?;
        }
        for t in file.tensors() {
            w.add_tensor(&t.name, &t.dims, t.ty)?;
        }
        Ok(w)
    }

    fn alignment(&self) -> u64 {
        self.metadata
            .iter()
            .find(|(k, _)| k == "general.alignment")
            .and_then(|(_, v)| v.as_u64())
            .unwrap_or(DEFAULT_ALIGNMENT)
    }

    pub fn add_metadata(&mut self, key: &str, value: impl Into<Value>) -> Result<()> {
        let value = value.into();
        if self.metadata.iter().any(|(k, _)| k == key) {
            return Err(GgufError::Write(format!("metadata key {key:?} added twice")));
        }
        if key == "general.alignment" {
            let ok = matches!(value, Value::U32(a) if a != 0 && a.is_power_of_two());
            if !ok || !self.tensors.is_empty() {
                return Err(GgufError::Write(
                    "general.alignment must be a power-of-two u32 set before tensors".into(),
                ));
            }
        }
        self.metadata.push((key.to_string(), value));
        Ok(())
    }

    /// Declares a tensor; its bytes are written later, in declaration order.
    pub fn add_tensor(&mut self, name: &str, dims: &[u64], ty: GgmlType) -> Result<&TensorInfo> {
        let err = |reason: String| GgufError::Tensor {
            name: name.to_string(),
            reason,
        };
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(err("declared twice".into()));
        }
        if dims.is_empty() || dims.len() > MAX_DIMS as usize {
            return Err(err(format!("{} dimensions (1 to {MAX_DIMS} allowed)", dims.len())));
        }
        let n: u64 = dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or_else(|| err("shape overflows".into()))?;
        if !dims[0].is_multiple_of(ty.block_elems() as u64) {
            return Err(err(format!(
                "row length {} is not a multiple of {}'s block",
                dims[0], ty
            )));
        }
        let size = ty.row_bytes(n).ok_or_else(|| err("size overflows".into()))?;
        let offset = self.data_size;
        self.data_size = align_up(offset + size, self.alignment()).ok_or_else(|| err("file too large".into()))?;
        self.tensors.push(TensorInfo {
            name: name.to_string(),
            dims: dims.to_vec(),
            ty,
            offset,
            size,
        });
        Ok(self.tensors.last().expect("just pushed"))
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// Total bytes the file will have.
    pub fn file_size(&self) -> u64 {
        self.header_bytes().len() as u64 + self.data_size
    }

    fn header_bytes(&self) -> Vec<u8> {
        let mut h = Vec::new();
        h.extend_from_slice(GGUF_MAGIC);
        h.extend_from_slice(&3u32.to_le_bytes());
        h.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        h.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_string(&mut h, k);
            h.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
            put_value(&mut h, v);
        }
        for t in &self.tensors {
            put_string(&mut h, &t.name);
            h.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                h.extend_from_slice(&d.to_le_bytes());
            }
            h.extend_from_slice(&t.ty.id().to_le_bytes());
            h.extend_from_slice(&t.offset.to_le_bytes());
        }
        // The padding aligns the data section; with no tensors there is none, and a file that parsed
        // with a huge `general.alignment` (any power of two is valid) must not make gigabytes of zeros
        // (the fuzzer's oom-0e1e3bff: 2^31 on a tensor-less header).
        if !self.tensors.is_empty() {
            let padded = align_up(h.len() as u64, self.alignment()).unwrap_or(h.len() as u64);
            h.resize(padded as usize, 0);
        }
        h
    }

    /// Writes the header and returns a sink that takes the tensors' bytes in declaration order.
    pub fn write_header<W: Write>(&self, mut out: W) -> Result<TensorSink<'_, W>> {
        out.write_all(&self.header_bytes())?;
        Ok(TensorSink {
            out,
            tensors: &self.tensors,
            alignment: self.alignment(),
            current: 0,
            written: 0,
        })
    }

    /// Writes a whole file, asking `data` for each tensor's bytes.
    pub fn write_all<'d, W: Write>(&self, out: W, mut data: impl FnMut(&TensorInfo) -> &'d [u8]) -> Result<W> {
        let mut sink = self.write_header(out)?;
        for t in &self.tensors {
            sink.write(data(t))?;
        }
        sink.finish()
    }
}

/// Receives tensor bytes in declaration order; a tensor may arrive in any number of pieces.
pub struct TensorSink<'a, W: Write> {
    out: W,
    tensors: &'a [TensorInfo],
    alignment: u64,
    current: usize,
    written: u64,
}

impl<W: Write> TensorSink<'_, W> {
    /// The tensor the next bytes belong to, if any remains.
    pub fn current(&self) -> Option<&TensorInfo> {
        self.tensors.get(self.current)
    }

    pub fn write(&mut self, mut bytes: &[u8]) -> Result<()> {
        while !bytes.is_empty() {
            let Some(t) = self.tensors.get(self.current) else {
                return Err(GgufError::Write(format!(
                    "{} bytes beyond the last tensor",
                    bytes.len()
                )));
            };
            let n = ((t.size - self.written) as usize).min(bytes.len());
            self.out.write_all(&bytes[..n])?;
            bytes = &bytes[n..];
            self.written += n as u64;
            if self.written == t.size {
                let pad = align_up(t.size, self.alignment).unwrap_or(t.size) - t.size;
                self.out.write_all(&vec![0u8; pad as usize])?;
                self.current += 1;
                self.written = 0;
            }
        }
        Ok(())
    }

    pub fn finish(mut self) -> Result<W> {
        if let Some(t) = self.tensors.get(self.current) {
            if t.size != 0 || self.current + 1 != self.tensors.len() {
                return Err(GgufError::Write(format!(
                    "tensor {:?} got {} of {} bytes; {} tensors never written",
                    t.name,
                    self.written,
                    t.size,
                    self.tensors.len() - self.current - 1
                )));
            }
        }
        self.out.flush()?;
        Ok(self.out)
    }
}

fn put_string(h: &mut Vec<u8>, s: &str) {
    h.extend_from_slice(&(s.len() as u64).to_le_bytes());
    h.extend_from_slice(s.as_bytes());
}

fn put_value(h: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => h.push(*x),
        Value::I8(x) => h.push(*x as u8),
        Value::U16(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => h.push(*x as u8),
        Value::String(s) => put_string(h, s),
        Value::Array(a) => put_array(h, a),
        Value::U64(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => h.extend_from_slice(&x.to_le_bytes()),
    }
}

fn put_array(h: &mut Vec<u8>, a: &Array) {
    h.extend_from_slice(&(a.element_type() as u32).to_le_bytes());
    h.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! each {
        ($items:expr, $x:ident => $body:expr) => {
            for $x in $items {
                $body
            }
        };
    }
    match a {
        Array::U8(v) => h.extend_from_slice(v),
        Array::I8(v) => each!(v, x => h.push(*x as u8)),
        Array::U16(v) => each!(v, x => h.extend_from_slice(&x.to_le_bytes())),
        Array::I16(v) => each!(v, x => h.extend_from_slice(&x.to_le_bytes())),
        Array::U32(v) => each!(v, x => h.extend_from_slice(&x.to_le_bytes())),
        Array::I32(v) => each!(v, x => h.extend_from_slice(&x.to_le_bytes())),
        Array::F32(v) => each!(v, x => h.extend_from_slice(&x.to_le_bytes())),
        Array::Bool(v) => each!(v, x => h.push(*x as u8)),
        Array::String(v) => each!(v, s => put_string(h, s)),
        Array::Array(v) => each!(v, inner => put_array(h, inner)),
        Array::U64(v) => each!(v, x => h.extend_from_slice(&x.to_le_bytes())),
        Array::I64(v) => each!(v, x => h.extend_from_slice(&x.to_le_bytes())),
        Array::F64(v) => each!(v, x => h.extend_from_slice(&x.to_le_bytes())),
    }
}
