//! The CUDA implementation of the layer graph's `Backend`: weights uploaded once (quantized for the
//! matvec route, plus an f16 copy for the GEMM route unless deterministic), activations as f32 device
//! buffers, KV in `GpuSequenceKv`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::ops::Range;
use std::rc::Rc;

use cudarc::cublas::{result::gemm_ex, sys as blas};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use tandem_backend::cpu::ops::{RopeParams, RopeStyle};
use tandem_gguf::GgmlType;
use tandem_model::backend::{AttendRows, Backend};
use tandem_model::config::Activation;
use tandem_model::weights::{Matrix, Norm, Weights};
use tandem_model::{graph, Model, ModelConfig, ModelError, Span};

use crate::device::{driver, Gpu};
use crate::kv::GpuSequenceKv;
use crate::routes::{self, KvRoute, MatmulRoute, MV_BATCH};
use crate::CudaError;

/// The kernel-name suffix of a weight type, or `None` when no CUDA kernel reads it.
pub fn type_suffix(ty: GgmlType) -> Option<&'static str> {
    Some(match ty {
        GgmlType::F32 => "f32",
        GgmlType::F16 => "f16",
        GgmlType::BF16 => "bf16",
        GgmlType::Q4_0 => "q4_0",
        GgmlType::Q4_1 => "q4_1",
        GgmlType::Q5_0 => "q5_0",
        GgmlType::Q8_0 => "q8_0",
        GgmlType::Q4_K => "q4_k",
        GgmlType::Q5_K => "q5_k",
        GgmlType::Q6_K => "q6_k",
        _ => return None,
    })
}

struct GpuMatrix {
    suffix: &'static str,
    quantized: CudaSlice<u8>,
    /// The GEMM route's operand (absent in deterministic mode and for the embedding table).
    f16: Option<CudaSlice<u16>>,
}

/// Device memory by purpose, for `--verbose`.
#[derive(Clone, Copy, Debug, Default)]
pub struct GpuMemory {
    pub weights_quantized: usize,
    pub weights_f16: usize,
    pub norms: usize,
}

/// Activations on the device: `rows × width` f32, row-major.
pub struct GpuAct {
    pub buf: CudaSlice<f32>,
    pub rows: usize,
    pub width: usize,
}

/// Scratch of the CUDA backend: nothing survives a call today (buffers come from the stream-ordered
/// allocator), but the graph's signature keeps room for it.
#[derive(Default)]
pub struct GpuScratch;

/// An index list and its device copy.
type Uploaded = (Vec<i32>, Rc<CudaSlice<i32>>);

pub struct CudaModel {
    /// The model as loaded for the CPU: config, weights and file (the GPU's oracle in checks).
    pub cpu: Model,
    pub gpu: Gpu,
    /// Every matmul on the matvec route: bit-identical logits across chunkings and batches.
    pub deterministic: bool,
    matrices: HashMap<String, GpuMatrix>,
    norms: HashMap<String, CudaSlice<f32>>,
    pub memory: GpuMemory,
    uploads: RefCell<Vec<Uploaded>>,
}

fn launch_cfg(grid: (u32, u32, u32), block: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: grid,
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn blocks(n: usize, per: usize) -> u32 {
    n.div_ceil(per).max(1) as u32
}

fn i32_of(n: usize, what: &str) -> Result<i32, CudaError> {
    i32::try_from(n).map_err(|_| CudaError::Driver {
        what: what.into(),
        err: format!("{n} does not fit a kernel's int"),
    })
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
            if type_suffix(m.ty).is_none() || m.cols % 256 != 0 && m.cols % 32 != 0 {
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
        for m in mats {
            let bytes = m.bytes(&cpu.file);
            let suffix = type_suffix(m.ty).expect("checked above");
            let quantized = gpu.upload(bytes)?;
            memory.weights_quantized += bytes.len();
            // The embedding table only needs its f16 copy when it is also the output projection.
            let multiplies = m.name != w.token_embd.name || w.output.name == w.token_embd.name;
            let f16 = if multiplies && !deterministic {
                memory.weights_f16 += m.rows * m.cols * 2;
                Some(dequant_f16(&gpu, suffix, &quantized, m.rows, m.cols)?)
            } else {
                None
            };
            matrices.insert(m.name.clone(), GpuMatrix { suffix, quantized, f16 });
            done += bytes.len();
            progress(done, total);
        }
        let mut norms = HashMap::new();
        for n in w.norms() {
            norms.insert(n.name.clone(), gpu.upload(&n.data)?);
            memory.norms += n.data.len() * 4;
        }
        gpu.synchronize()?;
        Ok(CudaModel {
            cpu,
            gpu,
            deterministic,
            matrices,
            norms,
            memory,
            uploads: RefCell::new(Vec::new()),
        })
    }

    /// A fresh device KV cache for one sequence of up to `n_ctx` positions.
    pub fn new_sequence(&self, n_ctx: usize) -> Result<GpuSequenceKv, CudaError> {
        GpuSequenceKv::new(&self.gpu, &self.cpu.config, n_ctx)
    }

    /// Runs the layer graph on the GPU; see [`graph::forward`].
    pub fn forward(
        &self,
        scratch: &mut GpuScratch,
        spans: &mut [Span<GpuSequenceKv>],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        graph::forward(self, scratch, spans)
    }

    fn matrix(&self, m: &Matrix) -> Result<&GpuMatrix, CudaError> {
        self.matrices.get(&m.name).ok_or_else(|| CudaError::Driver {
            what: format!("matrix {}", m.name),
            err: "not uploaded".into(),
        })
    }

    fn norm(&self, n: &Norm) -> Result<&CudaSlice<f32>, ModelError> {
        self.norms
            .get(&n.name)
            .ok_or_else(|| ModelError::Kernel(format!("norm {} not uploaded", n.name)))
    }

    /// Index lists (positions, cache rows) on the device. Every layer of a forward pass asks for the
    /// same few lists, so each distinct one is uploaded once per pass (`embed` starts a pass).
    fn upload_i32(&self, v: &[usize], what: &str) -> Result<Rc<CudaSlice<i32>>, CudaError> {
        let ints: Vec<i32> = v.iter().map(|&x| i32_of(x, what)).collect::<Result<_, _>>()?;
        self.upload_ints(ints)
    }

    fn upload_ints(&self, ints: Vec<i32>) -> Result<Rc<CudaSlice<i32>>, CudaError> {
        let mut memo = self.uploads.borrow_mut();
        if let Some((_, dev)) = memo.iter().find(|(h, _)| *h == ints) {
            return Ok(Rc::clone(dev));
        }
        let dev = Rc::new(self.gpu.upload(&ints)?);
        memo.push((ints, Rc::clone(&dev)));
        Ok(dev)
    }

    /// `out[t] = W · x[t]` on the matvec route (decode, short chunks, deterministic mode).
    pub fn matvec_raw(
        &self,
        suffix: &str,
        w: &CudaSlice<u8>,
        x: &CudaSlice<f32>,
        t: usize,
        rows: usize,
        cols: usize,
    ) -> Result<CudaSlice<f32>, CudaError> {
        let mut out = self.gpu.alloc::<f32>(t * rows)?;
        matvec_into(&self.gpu, suffix, w, x, t, rows, cols, &mut out)?;
        Ok(out)
    }

    /// `out[t] = W16 · f16(x[t])` through cuBLAS (f32 accumulation).
    fn gemm(
        &self,
        w16: &CudaSlice<u16>,
        x: &CudaSlice<f32>,
        t: usize,
        rows: usize,
        cols: usize,
    ) -> Result<CudaSlice<f32>, CudaError> {
        let mut out = self.gpu.alloc::<f32>(t * rows)?;
        gemm_into(&self.gpu, w16, x, t, rows, cols, &mut out)?;
        Ok(out)
    }

    #[allow(clippy::too_many_arguments)]
    fn attend_from(
        &self,
        q: &GpuAct,
        rows: &Range<usize>,
        kc: &CudaSlice<u16>,
        vc: &CudaSlice<u16>,
        source: (usize, usize, usize),
        positions: &[usize],
        window: Option<usize>,
        out: &mut GpuAct,
    ) -> Result<(), CudaError> {
        let c = &self.cpu.config;
        let (capacity, origin_logical, origin_physical) = source;
        let t = rows.len();
        let span = routes::tile_span(positions, window, origin_logical);
        let hd = c.head_dim;
        let mut partial = self.gpu.alloc::<f32>(t * c.n_head * span.n * (hd + 2))?;
        let pos = self.upload_i32(positions, "position")?;
        let qw = c.q_width();
        let q_view = q.buf.slice(rows.start * qw..rows.end * qw);
        let ints = |n: usize, what: &str| i32_of(n, what);
        let (cap, ol, op, kvw) = (
            ints(capacity, "capacity")?,
            ints(origin_logical, "origin")?,
            ints(origin_physical, "origin")?,
            ints(c.kv_width(), "kv width")?,
        );
        let (nh, nkv, hdi) = (
            ints(c.n_head, "heads")?,
            ints(c.n_kv_head, "kv heads")?,
            ints(hd, "head dim")?,
        );
        let (win, lo, nt) = (
            ints(window.unwrap_or(0), "window")?,
            ints(span.lo, "tile")?,
            ints(span.n, "tiles")?,
        );
        let scale = c.attn_scale;
        {
            let f = self.gpu.function("attend_partial")?;
            let mut b = self.gpu.stream.launch_builder(f);
            b.arg(&q_view)
                .arg(kc)
                .arg(vc)
                .arg(&cap)
                .arg(&ol)
                .arg(&op)
                .arg(&kvw)
                .arg(&*pos);
            b.arg(&nh)
                .arg(&nkv)
                .arg(&hdi)
                .arg(&scale)
                .arg(&win)
                .arg(&lo)
                .arg(&nt)
                .arg(&mut partial);
            let grid = (span.n as u32, c.n_head as u32, t as u32);
            driver("attend_partial", unsafe { b.launch(launch_cfg(grid, 32)) }).map(|_| ())?;
        }
        let mut out_view = out.buf.slice_mut(rows.start * qw..rows.end * qw);
        let f = self.gpu.function("attend_combine")?;
        let mut b = self.gpu.stream.launch_builder(f);
        b.arg(&partial).arg(&nh).arg(&hdi).arg(&nt).arg(&mut out_view);
        driver("attend_combine", unsafe {
            b.launch(launch_cfg((c.n_head as u32, t as u32, 1), 32))
        })
        .map(|_| ())?;
        Ok(())
    }

    /// Converts rows of K and V to f16 into `kc`/`vc` at rows `dst` (-1: skip).
    #[allow(clippy::too_many_arguments)]
    fn store(
        &self,
        k: &GpuAct,
        v: &GpuAct,
        rows: &Range<usize>,
        dst: &[i32],
        kc: &mut CudaSlice<u16>,
        vc: &mut CudaSlice<u16>,
    ) -> Result<(), CudaError> {
        let w = k.width;
        let dst_dev = self.upload_ints(dst.to_vec())?;
        let kv = k.buf.slice(rows.start * w..rows.end * w);
        let vv = v.buf.slice(rows.start * w..rows.end * w);
        let wi = i32_of(w, "kv width")?;
        let f = self.gpu.function("kv_store")?;
        let mut b = self.gpu.stream.launch_builder(f);
        b.arg(&kv).arg(&vv).arg(kc).arg(vc).arg(&*dst_dev).arg(&wi);
        driver("kv_store", unsafe {
            b.launch(launch_cfg((rows.len() as u32, 1, 1), 256))
        })
        .map(|_| ())?;
        Ok(())
    }
}

impl Backend for CudaModel {
    type Act = GpuAct;
    type Kv = GpuSequenceKv;
    type Scratch = GpuScratch;

    fn config(&self) -> &ModelConfig {
        &self.cpu.config
    }

    fn weights(&self) -> &Weights {
        &self.cpu.weights
    }

    fn new_kv(&self, n_ctx: usize) -> Result<GpuSequenceKv, ModelError> {
        Ok(self.new_sequence(n_ctx)?)
    }

    fn embed(&self, tokens: &[u32]) -> Result<GpuAct, ModelError> {
        let c = &self.cpu.config;
        let table = &self.cpu.weights.token_embd;
        if let Some(&id) = tokens.iter().find(|&&id| id as usize >= table.rows) {
            return Err(ModelError::Token {
                id,
                n_vocab: table.rows,
            });
        }
        self.uploads.borrow_mut().clear();
        let g = self.matrix(table)?;
        let ids: Vec<usize> = tokens.iter().map(|&t| t as usize).collect();
        let ids = self.upload_i32(&ids, "token id")?;
        let mut out = self.gpu.alloc::<f32>(tokens.len() * c.d_model)?;
        let (n, cols) = (i32_of(tokens.len(), "tokens")?, i32_of(c.d_model, "d_model")?);
        let scale = c.embed_scale.unwrap_or(1.0);
        let f = self.gpu.function(&format!("embed_{}", g.suffix))?;
        let mut b = self.gpu.stream.launch_builder(f);
        b.arg(&g.quantized)
            .arg(&*ids)
            .arg(&mut out)
            .arg(&n)
            .arg(&cols)
            .arg(&scale);
        let units = tokens.len() * c.d_model / 32;
        driver("embed", unsafe {
            b.launch(launch_cfg((blocks(units, 256), 1, 1), 256))
        })?;
        Ok(GpuAct {
            buf: out,
            rows: tokens.len(),
            width: c.d_model,
        })
    }

    fn duplicate(&self, x: &GpuAct) -> Result<GpuAct, ModelError> {
        Ok(GpuAct {
            buf: driver("cuMemcpyDtoD", self.gpu.stream.clone_dtod(&x.buf))?,
            rows: x.rows,
            width: x.width,
        })
    }

    fn zeros(&self, rows: usize, width: usize) -> Result<GpuAct, ModelError> {
        Ok(GpuAct {
            buf: self.gpu.alloc::<f32>(rows * width)?,
            rows,
            width,
        })
    }

    fn rms_norm(&self, x: &mut GpuAct, group: usize, weight: &Norm) -> Result<(), ModelError> {
        let w = self
            .norms
            .get(&weight.name)
            .ok_or_else(|| ModelError::Kernel(format!("norm {} not uploaded", weight.name)))?;
        let groups = x.rows * x.width / group;
        let (g, eps) = (i32_of(group, "group")?, self.cpu.config.eps);
        let f = self.gpu.function("rms_norm")?;
        let mut b = self.gpu.stream.launch_builder(f);
        b.arg(&mut x.buf).arg(w).arg(&g).arg(&eps);
        let threads = if group >= 1024 { 256 } else { 128 };
        driver("rms_norm", unsafe {
            b.launch(launch_cfg((groups as u32, 1, 1), threads))
        })?;
        Ok(())
    }

    fn matmul(&self, m: &Matrix, x: &GpuAct) -> Result<GpuAct, ModelError> {
        let g = self.matrix(m)?;
        let t = x.rows;
        let buf = match (routes::matmul_route(t, self.deterministic), &g.f16) {
            (MatmulRoute::Gemm, Some(w16)) => self.gemm(w16, &x.buf, t, m.rows, m.cols)?,
            _ => self.matvec_raw(g.suffix, &g.quantized, &x.buf, t, m.rows, m.cols)?,
        };
        Ok(GpuAct {
            buf,
            rows: t,
            width: m.rows,
        })
    }

    fn rope(&self, x: &mut GpuAct, positions: &[usize], rope: &RopeParams) -> Result<(), ModelError> {
        let hd = self.cpu.config.head_dim;
        let n_heads = x.width / hd;
        let pos = self.upload_i32(positions, "position")?;
        let n = x.rows * n_heads * (rope.n_rot / 2);
        let (rows, nh, hdi, nr) = (
            i32_of(x.rows, "rows")?,
            i32_of(n_heads, "heads")?,
            i32_of(hd, "head dim")?,
            i32_of(rope.n_rot, "n_rot")?,
        );
        let neox = i32::from(matches!(rope.style, RopeStyle::Neox));
        let f = self.gpu.function("rope")?;
        let mut b = self.gpu.stream.launch_builder(f);
        b.arg(&mut x.buf).arg(&*pos).arg(&rows).arg(&nh).arg(&hdi).arg(&nr);
        b.arg(&rope.freq_base).arg(&rope.freq_scale).arg(&neox);
        driver("rope", unsafe { b.launch(launch_cfg((blocks(n, 256), 1, 1), 256)) })?;
        Ok(())
    }

    fn store_and_attend(
        &self,
        _scratch: &mut GpuScratch,
        layer: usize,
        kv: &mut GpuSequenceKv,
        io: AttendRows<'_, GpuAct>,
        rows: Range<usize>,
        positions: &[usize],
    ) -> Result<(), ModelError> {
        let t = rows.len();
        let w = kv.kv_width;
        let lc = &mut kv.layers[layer];
        let window = lc.window;
        match routes::kv_route(&lc.placement, t, window) {
            KvRoute::InPlace => {
                let (dst, after) = routes::store_rows(&lc.placement, t);
                self.store(io.k, io.v, &rows, &dst, &mut lc.k, &mut lc.v)?;
                lc.placement = after;
                let p = lc.placement;
                let source = (p.capacity, p.origin_logical, p.origin_physical);
                self.attend_from(io.q, &rows, &lc.k, &lc.v, source, positions, window, io.out)?;
            }
            KvRoute::Staged { first, gather } => {
                let n = gather.len() + t;
                let mut ks = self.gpu.alloc::<u16>(n * w)?;
                let mut vs = self.gpu.alloc::<u16>(n * w)?;
                if !gather.is_empty() {
                    let src = self.upload_i32(&gather, "cache row")?;
                    let wi = i32_of(w, "kv width")?;
                    let f = self.gpu.function("kv_gather")?;
                    let mut b = self.gpu.stream.launch_builder(f);
                    b.arg(&lc.k).arg(&lc.v).arg(&*src).arg(&mut ks).arg(&mut vs).arg(&wi);
                    driver("kv_gather", unsafe {
                        b.launch(launch_cfg((gather.len() as u32, 1, 1), 256))
                    })?;
                }
                let staged: Vec<i32> = (gather.len()..n).map(|r| r as i32).collect();
                self.store(io.k, io.v, &rows, &staged, &mut ks, &mut vs)?;
                self.attend_from(io.q, &rows, &ks, &vs, (n, first, 0), positions, window, io.out)?;
                // Committed only after attention consumed the staged rows.
                let (dst, after) = routes::store_rows(&lc.placement, t);
                self.store(io.k, io.v, &rows, &dst, &mut lc.k, &mut lc.v)?;
                lc.placement = after;
            }
        }
        Ok(())
    }

    fn normed(&self, x: &GpuAct, weight: &Norm) -> Result<GpuAct, ModelError> {
        let w = self.norm(weight)?;
        let mut out = self.gpu.alloc::<f32>(x.rows * x.width)?;
        let (width, eps) = (i32_of(x.width, "width")?, self.cpu.config.eps);
        let f = self.gpu.function("rms_norm_to")?;
        let mut b = self.gpu.stream.launch_builder(f);
        b.arg(&x.buf).arg(&mut out).arg(w).arg(&width).arg(&eps);
        driver("rms_norm_to", unsafe {
            b.launch(launch_cfg((x.rows as u32, 1, 1), 256))
        })?;
        Ok(GpuAct {
            buf: out,
            rows: x.rows,
            width: x.width,
        })
    }

    fn add_normed(&self, x: &mut GpuAct, y: GpuAct, norm: Option<&Norm>) -> Result<(), ModelError> {
        // Without a norm the weight pointer is never read; any uploaded norm stands in.
        let w = self.norm(norm.unwrap_or(&self.cpu.weights.output_norm))?;
        let (width, eps, has) = (
            i32_of(x.width, "width")?,
            self.cpu.config.eps,
            i32::from(norm.is_some()),
        );
        let f = self.gpu.function("add_normed")?;
        let mut b = self.gpu.stream.launch_builder(f);
        b.arg(&mut x.buf).arg(&y.buf).arg(w).arg(&width).arg(&eps).arg(&has);
        driver("add_normed", unsafe {
            b.launch(launch_cfg((x.rows as u32, 1, 1), 256))
        })?;
        Ok(())
    }

    fn gated(&self, gate: &mut GpuAct, up: &GpuAct, act: Activation) -> Result<(), ModelError> {
        let n = gate.rows * gate.width;
        let n64 = n as u64;
        let a: i32 = match act {
            Activation::Silu => 0,
            Activation::GeluTanh => 1,
        };
        let f = self.gpu.function("gated")?;
        let mut b = self.gpu.stream.launch_builder(f);
        b.arg(&mut gate.buf).arg(&up.buf).arg(&n64).arg(&a);
        driver("gated", unsafe { b.launch(launch_cfg((blocks(n, 256), 1, 1), 256)) })?;
        Ok(())
    }

    fn gather_rows(&self, x: &GpuAct, rows: &[usize]) -> Result<GpuAct, ModelError> {
        let idx = self.upload_i32(rows, "row")?;
        let mut out = self.gpu.alloc::<f32>(rows.len() * x.width)?;
        let wi = i32_of(x.width, "width")?;
        let f = self.gpu.function("gather_rows")?;
        let mut b = self.gpu.stream.launch_builder(f);
        b.arg(&x.buf).arg(&*idx).arg(&mut out).arg(&wi);
        driver("gather_rows", unsafe {
            b.launch(launch_cfg((rows.len() as u32, 1, 1), 256))
        })?;
        Ok(GpuAct {
            buf: out,
            rows: rows.len(),
            width: x.width,
        })
    }

    fn to_host(&self, x: GpuAct) -> Result<Vec<f32>, ModelError> {
        Ok(self.gpu.download(&x.buf)?)
    }
}

/// `out[t] = W · x[t]` with the matvec kernel for weight type `suffix` (see `routes`).
#[allow(clippy::too_many_arguments)]
pub fn matvec_into(
    gpu: &Gpu,
    suffix: &str,
    w: &CudaSlice<u8>,
    x: &CudaSlice<f32>,
    t: usize,
    rows: usize,
    cols: usize,
    out: &mut CudaSlice<f32>,
) -> Result<(), CudaError> {
    let f = gpu.function(&format!("matvec_{suffix}"))?;
    let (r, c, n) = (i32_of(rows, "rows")?, i32_of(cols, "cols")?, i32_of(t, "t")?);
    let mut b = gpu.stream.launch_builder(f);
    b.arg(w).arg(x).arg(out).arg(&r).arg(&c).arg(&n);
    let grid = (blocks(rows, 4), blocks(t, MV_BATCH), 1);
    driver(&format!("matvec_{suffix}"), unsafe { b.launch(launch_cfg(grid, 128)) })?;
    Ok(())
}

/// Dequantizes a whole matrix of type `suffix` to f16 (the GEMM route's operand).
pub fn dequant_f16(
    gpu: &Gpu,
    suffix: &str,
    w: &CudaSlice<u8>,
    rows: usize,
    cols: usize,
) -> Result<CudaSlice<u16>, CudaError> {
    let mut out = gpu.alloc::<u16>(rows * cols)?;
    let f = gpu.function(&format!("dequant_f16_{suffix}"))?;
    let units = rows * (cols / 32);
    let (r, c) = (i32_of(rows, "rows")?, i32_of(cols, "cols")?);
    let mut b = gpu.stream.launch_builder(f);
    b.arg(w).arg(&mut out).arg(&r).arg(&c);
    driver(&format!("dequant_f16_{suffix}"), unsafe {
        b.launch(launch_cfg((blocks(units, 256), 1, 1), 256))
    })?;
    Ok(out)
}

/// `out[t] = W16 · f16(x[t])` through cuBLAS GemmEx: f16 operands, f32 accumulation and output.
pub fn gemm_into(
    gpu: &Gpu,
    w16: &CudaSlice<u16>,
    x: &CudaSlice<f32>,
    t: usize,
    rows: usize,
    cols: usize,
    out: &mut CudaSlice<f32>,
) -> Result<(), CudaError> {
    let n = t * cols;
    let mut x16 = gpu.alloc::<u16>(n)?;
    {
        let f = gpu.function("to_f16")?;
        let mut b = gpu.stream.launch_builder(f);
        let n64 = n as u64;
        b.arg(x).arg(&mut x16).arg(&n64);
        driver("to_f16", unsafe { b.launch(launch_cfg((blocks(n, 256), 1, 1), 256)) }).map(|_| ())?;
    }
    let stream = &gpu.stream;
    let (alpha, beta) = (1f32, 0f32);
    {
        let (a, _ga) = w16.device_ptr(stream);
        let (bx, _gb) = x16.device_ptr(stream);
        let (c, _gc) = out.device_ptr_mut(stream);
        // Column-major view: C (rows × t) = Wᵀ (W is cols × rows column-major) · X (cols × t).
        unsafe {
            gemm_ex(
                *gpu.blas.handle(),
                blas::cublasOperation_t::CUBLAS_OP_T,
                blas::cublasOperation_t::CUBLAS_OP_N,
                i32_of(rows, "rows")?,
                i32_of(t, "t")?,
                i32_of(cols, "cols")?,
                &alpha as *const f32 as *const c_void,
                a as *const c_void,
                blas::cudaDataType_t::CUDA_R_16F,
                i32_of(cols, "lda")?,
                bx as *const c_void,
                blas::cudaDataType_t::CUDA_R_16F,
                i32_of(cols, "ldb")?,
                &beta as *const f32 as *const c_void,
                c as *mut c_void,
                blas::cudaDataType_t::CUDA_R_32F,
                i32_of(rows, "ldc")?,
                blas::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| CudaError::Blas {
            what: format!("cublasGemmEx {rows}x{cols} by {t}"),
            err: format!("{e:?}"),
        })?;
    }
    Ok(())
}
