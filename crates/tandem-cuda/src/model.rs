//! The CUDA implementation of the layer graph's `Backend`: weights uploaded once by `upload.rs`
//! (quantized for the matvec route, plus an f16 copy for the GEMM route unless deterministic),
//! activations as f32 device buffers from a pool, KV in `GpuSequenceKv`. Decode steps replay a captured
//! CUDA graph (`decode_graph.rs`), so every op here runs in one of three modes (`Mode`).

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::rc::Rc;

use cudarc::driver::{CudaSlice, CudaView, PushKernelArg};
use tandem_backend::cpu::ops::{RopeParams, RopeStyle};
use tandem_model::backend::{AttendRows, Backend};
use tandem_model::config::Activation;
use tandem_model::weights::{Matrix, Norm, Weights};
use tandem_model::{Model, ModelConfig, ModelError, Span};

use crate::attention_gemm::key_range;
use crate::decode_graph::DecodeGraph;
use crate::device::{driver, Gpu};
use crate::int8::{mmvq_group_into, mmvq_into, quantize_act_into, ActQuant, MmvqTarget};
use crate::kv::GpuSequenceKv;
use crate::launch::{blocks, gemm_into, i32_of, launch_cfg, matvec_into, DecodeKernel};
use crate::pool::{BufPool, DevBuf};
use crate::profile::OpProfile;
use crate::routes::{self, AttentionRoute, KvRoute, MatmulRoute, ATT_TILE};
use crate::upload::{GpuMatrix, GpuMemory};
use crate::CudaError;

/// Activations on the device: `rows × width` f32, row-major. `buf` is `None` only in a dry run.
pub struct GpuAct {
    pub buf: Option<DevBuf<f32>>,
    pub rows: usize,
    pub width: usize,
    /// These rows quantized for the integer route, made by the first matmul that needs them and
    /// reused by the others reading the same input (q, k and v; gate and up). Cleared on any write.
    int8: RefCell<Vec<(ActQuant, DevBuf<u8>)>>,
}

impl GpuAct {
    pub fn buf(&self) -> Result<&CudaSlice<f32>, CudaError> {
        self.buf.as_deref().ok_or_else(dry_buffer)
    }

    pub(crate) fn buf_mut(&mut self) -> Result<&mut CudaSlice<f32>, CudaError> {
        self.int8.get_mut().clear();
        self.buf.as_deref_mut().ok_or_else(dry_buffer)
    }
}

fn no_norm_output() -> ModelError {
    ModelError::Kernel("add_norm_to made no normed output".into())
}

fn dry_buffer() -> CudaError {
    CudaError::Driver {
        what: "activation".into(),
        err: "a dry run has no device buffers".into(),
    }
}

/// Scratch of the CUDA backend: buffers live in the model's pools, so nothing is kept here.
#[derive(Default)]
pub struct GpuScratch;

/// How the ops of a forward pass execute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Launch kernels now; index lists are uploaded as they are made.
    Normal,
    /// Record kernels into a CUDA graph; index lists go to the parameter arena (uploaded before the
    /// graph first runs), and no memory may be allocated.
    Capture,
    /// Run only the host side (placement updates, index lists into the arena) for a graph replay.
    Dry,
}

/// An index list on the device: its own upload, or a span of the parameter arena.
pub(crate) enum Param {
    Own(Rc<CudaSlice<i32>>),
    Arena(Range<usize>),
}

/// An index list and its device copy.
type Uploaded = (Vec<i32>, Rc<CudaSlice<i32>>);

pub struct CudaModel {
    /// The model as loaded for the CPU: config, weights and file (the GPU's oracle in checks).
    pub cpu: Model,
    pub gpu: Gpu,
    /// Every matmul on the matvec route: bit-identical logits across chunkings and batches.
    pub deterministic: bool,
    /// Decode steps through captured CUDA graphs (`TANDEM_CUDA_GRAPHS=0` turns this off).
    pub graphs_enabled: Cell<bool>,
    pub(crate) matrices: HashMap<String, GpuMatrix>,
    pub(crate) norms: HashMap<String, CudaSlice<f32>>,
    /// Pre-norm name to the first matrix reading its output (whose kernel says how to quantize it).
    pub(crate) norm_readers: HashMap<String, String>,
    pub memory: GpuMemory,
    pub(crate) uploads: RefCell<Vec<Uploaded>>,
    pub(crate) mode: Cell<Mode>,
    pub(crate) arena: CudaSlice<i32>,
    pub(crate) staging: RefCell<Vec<i32>>,
    pub(crate) f32_pool: Rc<BufPool<f32>>,
    pub(crate) u16_pool: Rc<BufPool<u16>>,
    pub(crate) u8_pool: Rc<BufPool<u8>>,
    pub(crate) captured_out: RefCell<Option<DevBuf<f32>>>,
    pub(crate) graphs: RefCell<Vec<DecodeGraph>>,
    pub(crate) warmed: RefCell<VecDeque<u64>>,
    /// GPU time per op (`TANDEM_CUDA_PROFILE=1`).
    pub(crate) profile: Option<OpProfile>,
}

impl Drop for CudaModel {
    fn drop(&mut self) {
        if let Some(p) = &self.profile {
            eprint!("{}", p.report());
        }
    }
}

/// Threads of a one-block-per-row kernel (norms): a decode step has one row, so the block's width is
/// the kernel's parallelism. Fixed by the width alone, so a row's sums never depend on the batch.
fn row_threads(width: usize) -> u32 {
    if width >= 2048 {
        1024
    } else {
        256
    }
}

/// Flags of the `add_norm_to` kernel (`kernels/ops.cu`).
const RN_ADD: i32 = 1;
const RN_POST: i32 = 2;
const RN_NORM: i32 = 4;
const RN_Q8K: i32 = 8;
const RN_Q8: i32 = 16;
const RN_MAX_Q8K_WIDTH: usize = 8192;

/// A matmul's shape in the op profile: "rows x cols type, t=rows of activations".
struct MatmulShape {
    rows: usize,
    cols: usize,
    suffix: &'static str,
    t: usize,
}

impl std::fmt::Display for MatmulShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{} {}, t={}", self.rows, self.cols, self.suffix, self.t)
    }
}

/// Index slots in the parameter arena: far more than a decode step's few per layer.
pub(crate) const ARENA_INTS: usize = 1 << 16;

impl CudaModel {
    /// A fresh device KV cache for one sequence of up to `n_ctx` positions.
    pub fn new_sequence(&self, n_ctx: usize) -> Result<GpuSequenceKv, CudaError> {
        GpuSequenceKv::new(&self.gpu, &self.cpu.config, n_ctx)
    }

    fn dry(&self) -> bool {
        self.mode.get() == Mode::Dry
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

    /// An output activation: from the pool, or none at all in a dry run.
    fn act(&self, rows: usize, width: usize) -> Result<GpuAct, CudaError> {
        let buf = match self.mode.get() {
            Mode::Dry => None,
            mode => Some(self.f32_pool.take(&self.gpu, rows * width, mode == Mode::Normal)?),
        };
        Ok(GpuAct {
            buf,
            rows,
            width,
            int8: RefCell::new(Vec::new()),
        })
    }

    /// Index lists (positions, cache rows, placement) for kernels. Launched now: uploaded, each distinct
    /// list once per pass. Captured or replayed: appended to the arena, in the same order every step.
    pub(crate) fn param(&self, v: &[usize], what: &str) -> Result<Param, CudaError> {
        let ints: Vec<i32> = v.iter().map(|&x| i32_of(x, what)).collect::<Result<_, _>>()?;
        self.param_ints(ints)
    }

    fn param_ints(&self, ints: Vec<i32>) -> Result<Param, CudaError> {
        if self.mode.get() != Mode::Normal {
            let mut staging = self.staging.borrow_mut();
            let start = staging.len();
            if start + ints.len() > ARENA_INTS {
                return Err(CudaError::Driver {
                    what: "graph parameters".into(),
                    err: format!("more than {ARENA_INTS} index slots"),
                });
            }
            staging.extend(ints);
            return Ok(Param::Arena(start..staging.len()));
        }
        let mut memo = self.uploads.borrow_mut();
        if let Some((_, dev)) = memo.iter().find(|(h, _)| *h == ints) {
            return Ok(Param::Own(Rc::clone(dev)));
        }
        let dev = Rc::new(self.gpu.upload(&ints)?);
        memo.push((ints, Rc::clone(&dev)));
        Ok(Param::Own(dev))
    }

    pub(crate) fn view<'a>(&'a self, p: &'a Param) -> CudaView<'a, i32> {
        match p {
            Param::Own(s) => s.as_view(),
            Param::Arena(r) => self.arena.slice(r.clone()),
        }
    }

    /// `out[t] = W16 · f16(x[t])` through cuBLAS (f32 accumulation).
    fn gemm(
        &self,
        w16: &CudaSlice<u16>,
        x: &CudaSlice<f32>,
        t: usize,
        rows: usize,
        cols: usize,
    ) -> Result<GpuAct, CudaError> {
        let mut out = self.act(t, rows)?;
        let may_allocate = self.mode.get() == Mode::Normal;
        let mut x16 = self.u16_pool.take(&self.gpu, t * cols, may_allocate)?;
        gemm_into(&self.gpu, w16, x, &mut x16, t, rows, cols, out.buf_mut()?)?;
        Ok(out)
    }

    /// Runs `f` (which enqueues op `name`), timed when profiling.
    /// The name is only formatted when profiling, so the hot path does not allocate for it.
    fn profiled<T, E: From<CudaError>>(
        &self,
        name: impl std::fmt::Display,
        f: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        match &self.profile {
            Some(p) if self.mode.get() == Mode::Normal => p.time(&self.gpu, name.to_string(), f),
            _ => f(),
        }
    }

    /// Quantizes `x` for integer kernels reading `fmt`, unless an earlier matmul already did.
    fn quantize_once(&self, x: &GpuAct, fmt: ActQuant) -> Result<(), CudaError> {
        if x.int8.borrow().iter().any(|(f, _)| *f == fmt) {
            return Ok(());
        }
        let may_allocate = self.mode.get() == Mode::Normal;
        let mut a = self.u8_pool.take(&self.gpu, fmt.bytes(x.rows, x.width), may_allocate)?;
        self.profiled(format_args!("quantize {fmt:?} x{}", x.width), || {
            quantize_act_into(&self.gpu, fmt, x.buf()?, x.rows, x.width, &mut a)
        })?;
        x.int8.borrow_mut().push((fmt, a));
        Ok(())
    }

    /// Runs `f` on `x` quantized as `fmt` (quantizing it unless an earlier matmul did).
    fn with_quantized<T>(
        &self,
        x: &GpuAct,
        fmt: ActQuant,
        f: impl FnOnce(&CudaSlice<u8>) -> Result<T, CudaError>,
    ) -> Result<T, CudaError> {
        self.quantize_once(x, fmt)?;
        let cache = x.int8.borrow();
        let a = cache
            .iter()
            .find(|(f, _)| *f == fmt)
            .map(|(_, a)| a)
            .ok_or_else(|| CudaError::Driver {
                what: format!("activations quantized as {fmt:?}"),
                err: "missing after quantization".into(),
            })?;
        f(a)
    }

    /// Whether `t` rows of `g` take its matvec-route kernel (else the GEMM over its f16 copy).
    fn takes_matvec(&self, g: &GpuMatrix, t: usize) -> bool {
        routes::matmul_route(t, self.deterministic, g.decode_cublas) == MatmulRoute::Matvec || g.f16.is_none()
    }

    /// The quantized form the integer kernel of `reader` wants for `t` rows, when it takes that route
    /// (so the kernel producing its input can write it, saving a launch).
    fn int8_input(&self, reader: &str, t: usize) -> Option<ActQuant> {
        let g = self.matrices.get(reader)?;
        match g.decode {
            DecodeKernel::Int8 { fmt, .. } if self.takes_matvec(g, t) => Some(fmt),
            _ => None,
        }
    }

    /// One `add_norm_to` launch: `x += y` (normed by `post` when given) when `y` is given, then (when
    /// `norm` is given) a new activation `norm(x)`, also quantized when the matrices reading it take
    /// the integer route. The caller has cleared `x`'s quantized forms if `y` changes it.
    fn residual_norm(
        &self,
        x: &GpuAct,
        y: Option<&GpuAct>,
        post: Option<&Norm>,
        norm: Option<&Norm>,
    ) -> Result<Option<GpuAct>, ModelError> {
        let name = match (y.is_some(), norm.is_some()) {
            (true, true) => "add_and_norm",
            (true, false) => "add_normed",
            _ => "normed",
        };
        self.profiled(name, || {
            let mut out = match norm {
                Some(_) => Some(self.act(x.rows, x.width)?),
                None => None,
            };
            if self.dry() {
                return Ok(out);
            }
            // Q8_K rows are staged in the kernel's shared memory (`RN_MAX_Q8K_WIDTH`).
            let quant = norm
                .and_then(|n| self.norm_readers.get(&n.name))
                .and_then(|reader| self.int8_input(reader, x.rows))
                .filter(|&fmt| fmt != ActQuant::Q8K || x.width <= RN_MAX_Q8K_WIDTH);
            let mut flags = 0;
            if y.is_some() {
                flags |= RN_ADD;
            }
            if post.is_some() {
                flags |= RN_POST;
            }
            if norm.is_some() {
                flags |= RN_NORM;
            }
            match quant {
                Some(ActQuant::Q8K) => flags |= RN_Q8K,
                Some(ActQuant::Q8) => flags |= RN_Q8,
                None => {}
            }
            let may_allocate = self.mode.get() == Mode::Normal;
            let mut a = match quant {
                Some(fmt) => Some(self.u8_pool.take(&self.gpu, fmt.bytes(x.rows, x.width), may_allocate)?),
                None => None,
            };
            // Pointers the flags leave unread stand in for absent operands.
            let any_norm = self.norm(&self.cpu.weights.output_norm)?;
            let post_w = post.map(|n| self.norm(n)).transpose()?.unwrap_or(any_norm);
            let norm_w = norm.map(|n| self.norm(n)).transpose()?.unwrap_or(any_norm);
            let (width, eps) = (i32_of(x.width, "width")?, self.cpu.config.eps);
            let n_t = i32_of(x.rows, "rows")?;
            let f = self.gpu.function("add_norm_to")?;
            let mut b = self.gpu.stream.launch_builder(f);
            let x_buf = x.buf()?;
            b.arg(x_buf)
                .arg(y.map(|y| y.buf()).transpose()?.unwrap_or(x_buf))
                .arg(post_w);
            match out.as_mut() {
                Some(o) => b.arg(o.buf_mut()?),
                None => b.arg(x_buf),
            };
            b.arg(norm_w).arg(&width).arg(&eps).arg(&flags);
            let no_quants = 0u64;
            match a.as_deref_mut() {
                Some(a) => b.arg(a),
                None => b.arg(&no_quants),
            };
            b.arg(&n_t);
            driver("add_norm_to", unsafe {
                b.launch(launch_cfg((x.rows as u32, 1, 1), row_threads(x.width)))
            })?;
            if let (Some(o), Some(fmt), Some(a)) = (out.as_ref(), quant, a) {
                o.int8.borrow_mut().push((fmt, a));
            }
            Ok(out)
        })
    }

    /// RoPE on every head of `x` and, in the same launch, of `y`.
    fn rope_heads(
        &self,
        x: &mut GpuAct,
        mut y: Option<&mut GpuAct>,
        positions: &[usize],
        rope: &RopeParams,
    ) -> Result<(), ModelError> {
        // Index lists are uploaded outside the profiled span (they are in the graph's arena anyway).
        let pos = self.param(positions, "position")?;
        if self.dry() {
            return Ok(());
        }
        self.profiled("rope", || {
            let hd = self.cpu.config.head_dim;
            let (nx, ny) = (x.width / hd, y.as_ref().map_or(0, |y| y.width / hd));
            let n = x.rows * (nx + ny) * (rope.n_rot / 2);
            let (rows, nxi, nyi, hdi, nr) = (
                i32_of(x.rows, "rows")?,
                i32_of(nx, "heads")?,
                i32_of(ny, "heads")?,
                i32_of(hd, "head dim")?,
                i32_of(rope.n_rot, "n_rot")?,
            );
            let neox = i32::from(matches!(rope.style, RopeStyle::Neox));
            let pos_v = self.view(&pos);
            let f = self.gpu.function("rope")?;
            let mut b = self.gpu.stream.launch_builder(f);
            let no_heads = 0u64;
            b.arg(x.buf_mut()?);
            match y.as_mut() {
                Some(y) => b.arg(y.buf_mut()?),
                None => b.arg(&no_heads),
            };
            b.arg(&pos_v).arg(&rows).arg(&nxi).arg(&nyi).arg(&hdi).arg(&nr);
            b.arg(&rope.freq_base).arg(&rope.freq_scale).arg(&neox);
            driver("rope", unsafe { b.launch(launch_cfg((blocks(n, 256), 1, 1), 256)) })?;
            Ok(())
        })
    }

    /// Tiles a single query can span in a layer (the graph's fixed attention grid).
    fn tile_cap(&self, kv: &GpuSequenceKv, window: Option<usize>) -> usize {
        window.unwrap_or(kv.n_ctx).div_ceil(ATT_TILE) + 1
    }

    #[allow(clippy::too_many_arguments)]
    fn attend_from(
        &self,
        io: &mut AttendRows<'_, GpuAct>,
        rows: &Range<usize>,
        kc: &CudaSlice<u16>,
        vc: &CudaSlice<u16>,
        source: (usize, usize, usize),
        positions: &[usize],
        window: Option<usize>,
        tile_cap: usize,
    ) -> Result<(), CudaError> {
        let c = &self.cpu.config;
        let (capacity, origin_logical, origin_physical) = source;
        let t = rows.len();
        // Prefill chunks (never captured, so only in direct launches) take the tensor cores when their
        // keys are contiguous in this buffer.
        if self.mode.get() == Mode::Normal && routes::attention_route(t, self.deterministic) == AttentionRoute::Gemm {
            if let Some(keys) = key_range(positions, window, source) {
                return self.profiled("attend (GEMM route)", || {
                    self.attend_gemm(io, rows, kc, vc, keys, positions, window)
                });
            }
        }
        let span = routes::tile_span(positions, window, origin_logical);
        let tile_cap = tile_cap.max(span.n);
        let pos = self.param(positions, "position")?;
        let meta = self.param(&[origin_logical, origin_physical, span.lo, span.n], "placement")?;
        if self.dry() {
            return Ok(());
        }
        let hd = c.head_dim;
        let mut partial = self.act(t * c.n_head * tile_cap, hd + 2)?;
        let qw = c.q_width();
        let q_view = io.q.buf()?.slice(rows.start * qw..rows.end * qw);
        let ints = |n: usize, what: &str| i32_of(n, what);
        let (cap, kvw) = (ints(capacity, "capacity")?, ints(c.kv_width(), "kv width")?);
        let (nh, nkv, hdi) = (
            ints(c.n_head, "heads")?,
            ints(c.n_kv_head, "kv heads")?,
            ints(hd, "head dim")?,
        );
        let (win, tc) = (ints(window.unwrap_or(0), "window")?, ints(tile_cap, "tiles")?);
        let scale = c.attn_scale;
        let (pos_v, meta_v) = (self.view(&pos), self.view(&meta));
        let mut out_view = io.out.buf_mut()?.slice_mut(rows.start * qw..rows.end * qw);
        self.profiled("attend (tiles)", || {
            let f = self.gpu.function("attend_partial")?;
            let mut b = self.gpu.stream.launch_builder(f);
            b.arg(&q_view)
                .arg(kc)
                .arg(vc)
                .arg(&cap)
                .arg(&kvw)
                .arg(&pos_v)
                .arg(&meta_v);
            b.arg(&nh)
                .arg(&nkv)
                .arg(&hdi)
                .arg(&scale)
                .arg(&win)
                .arg(&tc)
                .arg(partial.buf_mut()?);
            let grid = (tile_cap as u32, c.n_head as u32, t as u32);
            driver("attend_partial", unsafe { b.launch(launch_cfg(grid, ATT_TILE as u32)) })?;
            let f = self.gpu.function("attend_combine")?;
            let mut b = self.gpu.stream.launch_builder(f);
            b.arg(partial.buf()?)
                .arg(&meta_v)
                .arg(&nh)
                .arg(&hdi)
                .arg(&tc)
                .arg(&mut out_view);
            driver("attend_combine", unsafe {
                b.launch(launch_cfg((c.n_head as u32, t as u32, 1), 32))
            })?;
            Ok(())
        })
    }

    /// Converts rows of K and V to f16 into `kc`/`vc` at rows `dst` (-1: skip).
    fn store(
        &self,
        io: &AttendRows<'_, GpuAct>,
        rows: &Range<usize>,
        dst: Vec<i32>,
        kc: &mut CudaSlice<u16>,
        vc: &mut CudaSlice<u16>,
    ) -> Result<(), CudaError> {
        let dst = self.param_ints(dst)?;
        if self.dry() {
            return Ok(());
        }
        let w = io.k.width;
        let kv = io.k.buf()?.slice(rows.start * w..rows.end * w);
        let vv = io.v.buf()?.slice(rows.start * w..rows.end * w);
        let wi = i32_of(w, "kv width")?;
        let dst_v = self.view(&dst);
        let f = self.gpu.function("kv_store")?;
        let mut b = self.gpu.stream.launch_builder(f);
        b.arg(&kv).arg(&vv).arg(kc).arg(vc).arg(&dst_v).arg(&wi);
        self.profiled("kv_store", || {
            driver("kv_store", unsafe {
                b.launch(launch_cfg((rows.len() as u32, 1, 1), 256))
            })
        })?;
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

    fn run(&self, scratch: &mut GpuScratch, spans: &mut [Span<GpuSequenceKv>]) -> Result<Vec<Vec<f32>>, ModelError> {
        self.run_with_graphs(scratch, spans)
    }

    fn embed(&self, tokens: &[u32]) -> Result<GpuAct, ModelError> {
        self.profiled("embed", || {
            let c = &self.cpu.config;
            let table = &self.cpu.weights.token_embd;
            if let Some(&id) = tokens.iter().find(|&&id| id as usize >= table.rows) {
                return Err(ModelError::Token {
                    id,
                    n_vocab: table.rows,
                });
            }
            // A pass starts here: uploads from the previous pass are not reused. Not while capturing: a
            // buffer freed during capture would become part of the graph (and fail the capture).
            if self.mode.get() != Mode::Capture {
                self.uploads.borrow_mut().clear();
            }
            let g = self.matrix(table)?;
            let ids: Vec<usize> = tokens.iter().map(|&t| t as usize).collect();
            let ids = self.param(&ids, "token id")?;
            let mut out = self.act(tokens.len(), c.d_model)?;
            if self.dry() {
                return Ok(out);
            }
            let (n, cols) = (i32_of(tokens.len(), "tokens")?, i32_of(c.d_model, "d_model")?);
            let scale = c.embed_scale.unwrap_or(1.0);
            let ids_v = self.view(&ids);
            let f = self.gpu.function(&format!("embed_{}", g.suffix))?;
            let mut b = self.gpu.stream.launch_builder(f);
            b.arg(&g.quantized)
                .arg(&ids_v)
                .arg(out.buf_mut()?)
                .arg(&n)
                .arg(&cols)
                .arg(&scale);
            let units = tokens.len() * c.d_model / 32;
            driver("embed", unsafe {
                b.launch(launch_cfg((blocks(units, 256), 1, 1), 256))
            })?;
            Ok(out)
        })
    }

    fn output_rows(&self, rows: usize, width: usize) -> Result<GpuAct, ModelError> {
        Ok(self.act(rows, width)?)
    }

    fn rms_norm(&self, x: &mut GpuAct, group: usize, weight: &Norm) -> Result<(), ModelError> {
        self.profiled("rms_norm (q/k norm)", || {
            if self.dry() {
                return Ok(());
            }
            let w = self.norm(weight)?;
            let groups = x.rows * x.width / group;
            let (g, eps) = (i32_of(group, "group")?, self.cpu.config.eps);
            let f = self.gpu.function("rms_norm")?;
            let mut b = self.gpu.stream.launch_builder(f);
            b.arg(x.buf_mut()?).arg(w).arg(&g).arg(&eps);
            let threads = if group >= 1024 { 256 } else { 128 };
            driver("rms_norm", unsafe {
                b.launch(launch_cfg((groups as u32, 1, 1), threads))
            })?;
            Ok(())
        })
    }

    fn normed(&self, x: &GpuAct, weight: &Norm) -> Result<GpuAct, ModelError> {
        self.residual_norm(x, None, None, Some(weight))?
            .ok_or_else(no_norm_output)
    }

    fn add_normed(&self, x: &mut GpuAct, y: GpuAct, norm: Option<&Norm>) -> Result<(), ModelError> {
        // The residual is written in place: drop its quantized forms first.
        x.int8.get_mut().clear();
        self.residual_norm(x, Some(&y), norm, None).map(|_| ())
    }

    fn add_and_norm(&self, x: &mut GpuAct, y: GpuAct, post: Option<&Norm>, norm: &Norm) -> Result<GpuAct, ModelError> {
        x.int8.get_mut().clear();
        self.residual_norm(x, Some(&y), post, Some(norm))?
            .ok_or_else(no_norm_output)
    }

    fn matmul(&self, m: &Matrix, x: &GpuAct) -> Result<GpuAct, ModelError> {
        let t = x.rows;
        if self.dry() {
            return Ok(self.act(t, m.rows)?);
        }
        let g = self.matrix(m)?;
        let shape = MatmulShape {
            rows: m.rows,
            cols: m.cols,
            suffix: g.suffix,
            t,
        };
        let out = match (self.takes_matvec(g, t), &g.f16) {
            (false, Some(w16)) => self.profiled(format_args!("gemm {shape}"), || {
                self.gemm(w16, x.buf()?, t, m.rows, m.cols)
            })?,
            _ => {
                let mut out = self.act(t, m.rows)?;
                match g.decode {
                    DecodeKernel::Float(family) => {
                        let buf = out.buf_mut()?;
                        self.profiled(format_args!("matvec {family:?} {shape}"), || {
                            matvec_into(
                                &self.gpu,
                                family,
                                g.suffix,
                                &g.quantized,
                                x.buf()?,
                                t,
                                m.rows,
                                m.cols,
                                buf,
                            )
                        })?
                    }
                    DecodeKernel::Int8 { fmt, variant } => {
                        let buf = out.buf_mut()?;
                        self.with_quantized(x, fmt, |a| {
                            self.profiled(format_args!("matvec Int8 {shape}"), || {
                                mmvq_into(&self.gpu, g.suffix, variant, &g.quantized, a, t, m.rows, m.cols, buf)
                            })
                        })?
                    }
                }
                out
            }
        };
        Ok(out)
    }

    fn matmuls(&self, ms: &[&Matrix], x: &GpuAct) -> Result<Vec<GpuAct>, ModelError> {
        let t = x.rows;
        if self.dry() || ms.len() < 2 {
            return ms.iter().map(|m| self.matmul(m, x)).collect();
        }
        let gs = ms.iter().map(|m| self.matrix(m)).collect::<Result<Vec<_>, _>>()?;
        // Members on the integer matvec route with one kernel, type and width share a launch.
        let key = |j: usize| match gs[j].decode {
            DecodeKernel::Int8 { fmt, variant } if self.takes_matvec(gs[j], t) => {
                Some((fmt, variant, gs[j].suffix, ms[j].cols))
            }
            _ => None,
        };
        let mut outs: Vec<Option<GpuAct>> = ms.iter().map(|_| None).collect();
        for i in 0..ms.len() {
            if outs[i].is_some() {
                continue;
            }
            let members: Vec<usize> = match key(i) {
                Some(k) => (i..ms.len())
                    .filter(|&j| outs[j].is_none() && key(j) == Some(k))
                    .take(3)
                    .collect(),
                None => vec![i],
            };
            let Some((fmt, variant, suffix, cols)) = key(i).filter(|_| members.len() > 1) else {
                outs[i] = Some(self.matmul(ms[i], x)?);
                continue;
            };
            let mut acts = members
                .iter()
                .map(|&j| self.act(t, ms[j].rows))
                .collect::<Result<Vec<_>, _>>()?;
            let total: usize = members.iter().map(|&j| ms[j].rows).sum();
            self.with_quantized(x, fmt, |a| {
                let mut targets = members
                    .iter()
                    .zip(acts.iter_mut())
                    .map(|(&j, act)| {
                        Ok(MmvqTarget {
                            w: &gs[j].quantized,
                            rows: ms[j].rows,
                            out: act.buf_mut()?,
                        })
                    })
                    .collect::<Result<Vec<_>, CudaError>>()?;
                let n = members.len();
                self.profiled(
                    format_args!("matvec Int8 {n} matrices {total}x{cols} {suffix}, t={t}"),
                    || mmvq_group_into(&self.gpu, suffix, variant, &mut targets, a, t, cols),
                )
            })?;
            for (j, act) in members.into_iter().zip(acts) {
                outs[j] = Some(act);
            }
        }
        outs.into_iter()
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| ModelError::Kernel("a grouped matmul left a product unmade".into()))
    }

    fn rope(&self, x: &mut GpuAct, positions: &[usize], rope: &RopeParams) -> Result<(), ModelError> {
        self.rope_heads(x, None, positions, rope)
    }

    fn rope_qk(
        &self,
        q: &mut GpuAct,
        k: &mut GpuAct,
        positions: &[usize],
        rope: &RopeParams,
    ) -> Result<(), ModelError> {
        self.rope_heads(q, Some(k), positions, rope)
    }

    fn store_and_attend(
        &self,
        _scratch: &mut GpuScratch,
        layer: usize,
        kv: &mut GpuSequenceKv,
        mut io: AttendRows<'_, GpuAct>,
        rows: Range<usize>,
        positions: &[usize],
    ) -> Result<(), ModelError> {
        {
            let t = rows.len();
            let w = kv.kv_width;
            let window = kv.layers[layer].window;
            // One query spans at most `tile_cap` tiles: decode steps keep one grid, so a graph replays.
            let tile_cap = if t == 1 { self.tile_cap(kv, window) } else { 0 };
            let lc = &mut kv.layers[layer];
            match routes::kv_route(&lc.placement, t, window) {
                KvRoute::InPlace => {
                    let (dst, after) = routes::store_rows(&lc.placement, t);
                    self.store(&io, &rows, dst, &mut lc.k, &mut lc.v)?;
                    lc.placement = after;
                    let p = lc.placement;
                    let source = (p.capacity, p.origin_logical, p.origin_physical);
                    self.attend_from(&mut io, &rows, &lc.k, &lc.v, source, positions, window, tile_cap)?;
                }
                KvRoute::Staged { first, gather } => {
                    let n = gather.len() + t;
                    let mut ks = self.gpu.alloc::<u16>(n * w)?;
                    let mut vs = self.gpu.alloc::<u16>(n * w)?;
                    if !gather.is_empty() {
                        let src = self.param(&gather, "cache row")?;
                        let src_v = self.view(&src);
                        let wi = i32_of(w, "kv width")?;
                        let f = self.gpu.function("kv_gather")?;
                        let mut b = self.gpu.stream.launch_builder(f);
                        b.arg(&lc.k).arg(&lc.v).arg(&src_v).arg(&mut ks).arg(&mut vs).arg(&wi);
                        self.profiled("kv_gather", || {
                            driver("kv_gather", unsafe {
                                b.launch(launch_cfg((gather.len() as u32, 1, 1), 256))
                            })
                        })?;
                    }
                    let staged: Vec<i32> = (gather.len()..n).map(|r| r as i32).collect();
                    self.store(&io, &rows, staged, &mut ks, &mut vs)?;
                    self.attend_from(&mut io, &rows, &ks, &vs, (n, first, 0), positions, window, 0)?;
                    // Committed only after attention consumed the staged rows.
                    let (dst, after) = routes::store_rows(&lc.placement, t);
                    self.store(&io, &rows, dst, &mut lc.k, &mut lc.v)?;
                    lc.placement = after;
                }
            }
            Ok(())
        }
    }

    fn gated(&self, gate: &mut GpuAct, up: &GpuAct, act: Activation, reader: &Matrix) -> Result<(), ModelError> {
        self.profiled("gated", || {
            if self.dry() {
                return Ok(());
            }
            let a: i32 = match act {
                Activation::Silu => 0,
                Activation::GeluTanh => 1,
            };
            // Quantized here for the reader's integer kernel, when it takes one (rows in 256s).
            let quant = self
                .int8_input(&reader.name, gate.rows)
                .filter(|_| gate.width.is_multiple_of(256));
            let Some(fmt) = quant else {
                let n = gate.rows * gate.width;
                let n64 = n as u64;
                let f = self.gpu.function("gated")?;
                let mut b = self.gpu.stream.launch_builder(f);
                b.arg(gate.buf_mut()?).arg(up.buf()?).arg(&n64).arg(&a);
                driver("gated", unsafe { b.launch(launch_cfg((blocks(n, 256), 1, 1), 256)) })?;
                return Ok(());
            };
            let may_allocate = self.mode.get() == Mode::Normal;
            let mut q = self
                .u8_pool
                .take(&self.gpu, fmt.bytes(gate.rows, gate.width), may_allocate)?;
            let qfmt = match fmt {
                ActQuant::Q8K => RN_Q8K,
                ActQuant::Q8 => RN_Q8,
            };
            let (width, n_t) = (i32_of(gate.width, "width")?, i32_of(gate.rows, "rows")?);
            let grid = ((gate.width / 256) as u32, gate.rows as u32, 1);
            let f = self.gpu.function("gated_quant")?;
            let mut b = self.gpu.stream.launch_builder(f);
            b.arg(gate.buf_mut()?)
                .arg(up.buf()?)
                .arg(&width)
                .arg(&a)
                .arg(&qfmt)
                .arg(&mut *q)
                .arg(&n_t);
            driver("gated_quant", unsafe { b.launch(launch_cfg(grid, 256)) })?;
            gate.int8.get_mut().push((fmt, q));
            Ok(())
        })
    }

    fn gather_rows(&self, x: &GpuAct, rows: &[usize]) -> Result<GpuAct, ModelError> {
        self.profiled("gather_rows", || {
            let idx = self.param(rows, "row")?;
            let mut out = self.act(rows.len(), x.width)?;
            if self.dry() {
                return Ok(out);
            }
            let wi = i32_of(x.width, "width")?;
            let idx_v = self.view(&idx);
            let f = self.gpu.function("gather_rows")?;
            let mut b = self.gpu.stream.launch_builder(f);
            b.arg(x.buf()?).arg(&idx_v).arg(out.buf_mut()?).arg(&wi);
            driver("gather_rows", unsafe {
                b.launch(launch_cfg((rows.len() as u32, 1, 1), 256))
            })?;
            Ok(out)
        })
    }

    fn to_host(&self, x: GpuAct) -> Result<Vec<f32>, ModelError> {
        match self.mode.get() {
            Mode::Normal => {
                let host = self.gpu.download(x.buf()?)?;
                if let Some(p) = &self.profile {
                    p.collect()?;
                }
                Ok(host)
            }
            // The graph's output: read after the graph runs.
            Mode::Capture => {
                *self.captured_out.borrow_mut() = x.buf;
                Ok(Vec::new())
            }
            Mode::Dry => Ok(Vec::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn residual_norm_flags_match_the_kernel() {
        let src = crate::nvrtc::OPS.body;
        for (name, v) in [
            ("RN_ADD", RN_ADD),
            ("RN_POST", RN_POST),
            ("RN_NORM", RN_NORM),
            ("RN_Q8K", RN_Q8K),
            ("RN_Q8", RN_Q8),
            ("RN_MAX_Q8K_WIDTH", RN_MAX_Q8K_WIDTH as i32),
        ] {
            let value = v.to_string();
            let defined = src.lines().any(|l| {
                let words: Vec<&str> = l.split_whitespace().take(3).collect();
                words == ["#define", name, value.as_str()]
            });
            assert!(defined, "{name} = {v} in ops.cu");
        }
    }
}
