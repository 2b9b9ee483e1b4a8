//! Loading a model onto the GPU: every matrix uploaded once, an f16 copy made for the GEMM route
//! (unless deterministic), and the decode kernel of each matrix shape chosen by timing the candidates
//! (`launch::tune_decode`); the integer route's weights are repacked here when it wins.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;

use cudarc::driver::CudaSlice;
use tandem_model::Model;

use crate::device::Gpu;
use crate::int8::{self, int8_format};
use crate::launch::{dequant_f16, tune_decode, type_suffix, DecodeKernel};
use crate::model::{CudaModel, Mode, ARENA_INTS};
use crate::profile::OpProfile;
use crate::CudaError;

pub(crate) struct GpuMatrix {
    pub(crate) suffix: &'static str,
    /// The quantized weights, in the layout `decode` reads (the ggml layout unless `Int8` repacked them).
    pub(crate) quantized: CudaSlice<u8>,
    /// The GEMM route's operand (absent in deterministic mode and for the embedding table).
    pub(crate) f16: Option<CudaSlice<u16>>,
    /// The matvec-route kernel measured fastest for this shape (used for every row count).
    pub(crate) decode: DecodeKernel,
    /// Whether cuBLAS over the f16 copy beat every matvec for one row (not in deterministic mode).
    pub(crate) decode_cublas: bool,
}

/// Device memory by purpose, for `--verbose`.
#[derive(Clone, Copy, Debug, Default)]
pub struct GpuMemory {
    pub weights_quantized: usize,
    pub weights_f16: usize,
    pub norms: usize,
}

impl CudaModel {
    /// Uploads `cpu`'s weights to GPU `ordinal`; `progress(done, total)` follows the bytes.
    pub fn load(
        cpu: Model,
        ordinal: usize,
        deterministic: bool,
        mut progress: impl FnMut(usize, usize),
    ) -> Result<Self, CudaError> {
        let gpu = Gpu::new(ordinal)?;
        let w = &cpu.weights;
        let mats = w.matrices();
        for m in &mats {
            if type_suffix(m.ty).is_none() || m.cols % 32 != 0 {
                return Err(CudaError::UnsupportedType {
                    name: m.name.clone(),
                    ty: m.ty,
                });
            }
        }
        let total: usize = mats.iter().map(|m| m.bytes(&cpu.file).len()).sum();
        let mut done = 0;
        let mut memory = GpuMemory::default();
        let mut matrices = HashMap::new();
        let mut tuned = HashMap::new();
        let int8_enabled = std::env::var("TANDEM_CUDA_INT8").map_or(true, |v| v != "0");
        for m in mats {
            let bytes = m.bytes(&cpu.file);
            let suffix = type_suffix(m.ty).expect("checked above");
            let original = gpu.upload(bytes)?;
            memory.weights_quantized += bytes.len();
            // The embedding table only needs its f16 copy when it is also the output projection.
            let multiplies = m.name != w.token_embd.name || w.output.name == w.token_embd.name;
            let f16 = if multiplies && !deterministic {
                memory.weights_f16 += m.rows * m.cols * 2;
                Some(dequant_f16(&gpu, suffix, &original, m.rows, m.cols)?)
            } else {
                None
            };
            // The embedding kernels read the ggml layout, so the table never takes the integer route.
            let int8_fmt = int8_format(m.ty).filter(|_| int8_enabled && m.name != w.token_embd.name);
            // The choice depends on whether the integer kernel was on offer (not for the embedding table).
            let key = (suffix, m.rows, m.cols, int8_fmt.is_some());
            let mut repacked = None;
            let (decode, decode_cublas) = match tuned.get(&key) {
                Some(&choice) => choice,
                None => {
                    if let Some(fmt) = int8_fmt {
                        repacked = Some((fmt, int8::repack(&gpu, m.ty, &original, m.rows, m.cols)?));
                    }
                    let int8 = repacked
                        .as_ref()
                        .map(|(fmt, r)| (*fmt, r.as_ref().unwrap_or(&original)));
                    let choice = tune_decode(&gpu, suffix, &original, int8, f16.as_ref(), m.rows, m.cols)?;
                    tuned.insert(key, choice);
                    choice
                }
            };
            // Keep one copy of the quantized weights: the layout the chosen decode kernel reads.
            let quantized = match decode {
                DecodeKernel::Int8(_) => match repacked {
                    Some((_, r)) => r.unwrap_or(original),
                    None => int8::repack(&gpu, m.ty, &original, m.rows, m.cols)?.unwrap_or(original),
                },
                DecodeKernel::Float(_) => original,
            };
            matrices.insert(
                m.name.clone(),
                GpuMatrix {
                    suffix,
                    quantized,
                    f16,
                    decode,
                    decode_cublas,
                },
            );
            done += bytes.len();
            progress(done, total);
        }
        let mut norms = HashMap::new();
        for n in w.norms() {
            norms.insert(n.name.clone(), gpu.upload(&n.data)?);
            memory.norms += n.data.len() * 4;
        }
        let arena = gpu.alloc::<i32>(ARENA_INTS)?;
        let profile = (std::env::var("TANDEM_CUDA_PROFILE").as_deref() == Ok("1")).then(OpProfile::default);
        gpu.synchronize()?;
        Ok(CudaModel {
            cpu,
            gpu,
            deterministic,
            graphs_enabled: Cell::new(
                profile.is_none() && std::env::var("TANDEM_CUDA_GRAPHS").map_or(true, |v| v != "0"),
            ),
            matrices,
            norms,
            memory,
            uploads: RefCell::new(Vec::new()),
            mode: Cell::new(Mode::Normal),
            arena,
            staging: RefCell::new(Vec::new()),
            f32_pool: Rc::default(),
            u16_pool: Rc::default(),
            u8_pool: Rc::default(),
            captured_out: RefCell::new(None),
            graphs: RefCell::new(Vec::new()),
            warmed: RefCell::new(VecDeque::new()),
            profile,
        })
    }
}
