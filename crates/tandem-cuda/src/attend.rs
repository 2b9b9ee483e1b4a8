//! The CUDA backend's attention outside the flash route (`flash.rs`): K and V stored into the
//! cache (or a staging buffer when the chunk meets a wrapped ring), then the tile kernel, whose last
//! block per query and head merges the tiles (`kernels/attention.cu`). A decode step fuses RoPE and
//! the store into the tile kernel; a batched decode step (one row of each of several sequences) runs
//! that fused kernel for every row in one launch, each row finding its own cache through its
//! sequence's buffer table.

use std::cell::RefMut;
use std::ops::Range;

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, PushKernelArg};
use tandem_backend::cpu::ops::{RopeParams, RopeStyle};
use tandem_model::backend::{AttendRows, QkvRows};
use tandem_model::{graph, ModelError, Span};

use crate::device::driver;
use crate::flash::key_range;
use crate::int8::ActQuant;
use crate::kv::GpuSequenceKv;
use crate::launch::{blocks, i32_of, launch_cfg};
use crate::model::{CudaModel, GpuAct, GpuScratch, Mode, Param};
use crate::pool::DevBuf;
use crate::routes::{self, AttentionRoute, KvRoute, ATT_THREADS, ATT_TILE, MATVEC_MAX_ROWS};
use crate::rows::{quant_flag, RopeArgs};
use crate::{CudaError, Gpu};

/// One launch of the tile attention kernel (`kernels/attention.cu`): its shape.
#[derive(Clone, Copy, Debug)]
pub struct TileShape {
    /// Queries (rows of q and of the output).
    pub t: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub scale: f32,
    pub window: Option<usize>,
    /// Rows of the K/V buffer (a ring's capacity).
    pub capacity: usize,
    /// Tiles the grid spans (`meta` says how many are live).
    pub tile_cap: usize,
    /// Heads merged and quantized together (`routes::attention_merge`), and the quantization flag
    /// (`rows::quant_flag`; 0: none).
    pub group: usize,
    pub quant: i32,
    /// Live tiles from which a block takes all of its KV head's query heads
    /// (`routes::attention_group_tiles`); `usize::MAX`: never.
    pub group_tiles: usize,
}

/// The K/V buffer the kernel attends over: read only, or (the fused decode step, `FreshRow`) read
/// with the step's own row written into it.
pub enum KvCache<'a> {
    Read(CudaView<'a, u16>, CudaView<'a, u16>),
    Write(CudaViewMut<'a, u16>, CudaViewMut<'a, u16>),
}

impl KvCache<'_> {
    fn rows_len(&self) -> usize {
        match self {
            KvCache::Read(k, v) => k.len().min(v.len()),
            KvCache::Write(k, v) => k.len().min(v.len()),
        }
    }
}

/// A decode step's own row for the fused kernel (`attend_rope_d<D>`): q arrives unrotated, K and V
/// as the projections' f32 rows (one row of the KV heads each). The kernel applies RoPE to q and K as
/// `rope_kv_store` does, attends to the step's key from the rotated row, and stores K and V to cache
/// row `cache_row[0]` (-1: not stored), so the cache and the output have the bits of `rope_kv_store`
/// followed by `attend_tiles_d<D>`. With `head_norms` (QK-norm: the q and k norms' weights, one head
/// wide, and the norm's epsilon) it first norms each head of q and K as `rms_norm` does.
pub struct FreshRow<'a> {
    pub k: CudaView<'a, f32>,
    pub v: CudaView<'a, f32>,
    pub cache_row: CudaView<'a, i32>,
    pub rope: RopeParams,
    pub head_norms: Option<(CudaView<'a, f32>, CudaView<'a, f32>, f32)>,
}

/// Its buffers. `meta` = {origin_logical, origin_physical, first tile, live tiles}; `partial` holds
/// t * n_head * tile_cap records of head_dim + 2; `arrivals` t * n_head zeroed counters (the kernel
/// leaves them zeroed); `quants` the quantized output when `quant` is set; `fresh` the step's own
/// row (one query, a writable cache), or `None` when the cache already holds every key.
pub struct TileBuffers<'a> {
    pub q: CudaView<'a, f32>,
    pub cache: KvCache<'a>,
    pub pos: CudaView<'a, i32>,
    pub meta: CudaView<'a, i32>,
    pub partial: &'a mut CudaSlice<f32>,
    pub arrivals: &'a mut CudaSlice<i32>,
    pub out: CudaViewMut<'a, f32>,
    pub quants: Option<&'a mut CudaSlice<u8>>,
    pub fresh: Option<FreshRow<'a>>,
}

pub(crate) fn tile_error(err: String) -> CudaError {
    CudaError::Driver {
        what: "tile attention".into(),
        err,
    }
}

/// Launches the tile attention kernel for `s.head_dim` (one kernel per supported head size; the
/// fused one when `b.fresh` is given).
pub fn tile_attention_into(gpu: &Gpu, s: &TileShape, b: TileBuffers<'_>) -> Result<(), CudaError> {
    if !routes::head_dim_supported(s.head_dim) {
        return Err(CudaError::UnsupportedHeadDim(s.head_dim));
    }
    let (qw, kvw) = (s.n_head * s.head_dim, s.n_kv_head * s.head_dim);
    let short = |what: &str, have: usize, need: usize| {
        (have < need).then(|| CudaError::Driver {
            what: format!("tile attention {what}"),
            err: format!("{have} elements, {need} needed"),
        })
    };
    let records = s.t * s.n_head * s.tile_cap * (s.head_dim + 2);
    let fresh_lens = b
        .fresh
        .as_ref()
        .map_or((kvw, 1), |f| (f.k.len().min(f.v.len()), f.cache_row.len()));
    let shortfall = [
        short("queries", b.q.len(), s.t * qw),
        short("output", b.out.len(), s.t * qw),
        short("keys", b.cache.rows_len(), s.capacity * kvw),
        short("positions", b.pos.len(), s.t),
        short("placement", b.meta.len(), 4),
        short("partials", b.partial.len(), records),
        short("arrival counters", b.arrivals.len(), s.t * s.n_head),
        short("step's own K and V", fresh_lens.0, kvw),
        short("step's cache row", fresh_lens.1, 1),
        short(
            "head norms",
            b.fresh
                .as_ref()
                .and_then(|f| f.head_norms.as_ref())
                .map_or(s.head_dim, |(q, k, _)| q.len().min(k.len())),
            s.head_dim,
        ),
    ]
    .into_iter()
    .flatten()
    .next();
    if let Some(err) = shortfall {
        return Err(err);
    }
    let groups_fit =
        s.n_kv_head > 0 && s.n_head.is_multiple_of(s.n_kv_head) && s.group > 0 && s.n_head.is_multiple_of(s.group);
    let quants_fit = s.quant == 0 || b.quants.as_ref().is_some_and(|a| a.len() >= s.t * qw);
    if !groups_fit || !quants_fit {
        return Err(tile_error(format!(
            "{} heads over {} KV heads in merge groups of {}, quantization {} with {} bytes",
            s.n_head,
            s.n_kv_head,
            s.group,
            s.quant,
            b.quants.as_ref().map_or(0, |a| a.len())
        )));
    }
    if let Some(f) = &b.fresh {
        let writable = matches!(b.cache, KvCache::Write(..));
        let n_rot = f.rope.n_rot;
        if s.t != 1 || !writable || !n_rot.is_multiple_of(2) || n_rot > s.head_dim {
            return Err(tile_error(format!(
                "the fused step takes one query (not {}), a writable cache ({writable}) and an even \
                 rotation within the head (n_rot {n_rot}, head size {})",
                s.t, s.head_dim
            )));
        }
    }
    let ints = |n: usize, what: &str| i32_of(n, what);
    let (cap, kvw_i) = (ints(s.capacity, "capacity")?, ints(kvw, "kv width")?);
    let (nh, nkv) = (ints(s.n_head, "heads")?, ints(s.n_kv_head, "kv heads")?);
    let (win, tc) = (ints(s.window.unwrap_or(0), "window")?, ints(s.tile_cap, "tiles")?);
    let (group, n_t) = (ints(s.group, "heads per group")?, ints(s.t, "rows")?);
    let group_tiles = ints(s.group_tiles.min(i32::MAX as usize), "tiles from which heads group")?;
    // The fused decode kernel takes its tiles in one wave of blocks a head (in a deep context `heads`
    // heads of a KV head a block over as many times the shares); the plain one a block per tile and
    // head.
    let (name, grid) = match &b.fresh {
        Some(_) => {
            let name = match decode_heads(gpu, s) {
                1 => format!("attend_rope_d{}", s.head_dim),
                nh => format!("attend_rope_h{nh}_d{}", s.head_dim),
            };
            (name, (decode_splits(gpu, s) as u32, s.n_head as u32, 1))
        }
        None => (
            format!("attend_tiles_d{}", s.head_dim),
            (s.tile_cap as u32, s.n_head as u32, s.t as u32),
        ),
    };
    let f = gpu.function(&name)?;
    let mut l = gpu.launch_builder(f)?;
    l.arg(&b.q);
    let mut cache = b.cache;
    match &mut cache {
        KvCache::Read(k, v) => l.arg(&*k).arg(&*v),
        KvCache::Write(k, v) => l.arg(k).arg(v),
    };
    l.arg(&cap).arg(&kvw_i).arg(&b.pos).arg(&b.meta);
    l.arg(&nh)
        .arg(&nkv)
        .arg(&s.scale)
        .arg(&win)
        .arg(&tc)
        .arg(b.partial)
        .arg(b.arrivals);
    let mut out = b.out;
    l.arg(&mut out).arg(&group).arg(&s.quant);
    let no_quants = 0u64;
    match b.quants {
        Some(a) => l.arg(a),
        None => l.arg(&no_quants),
    };
    // The fused kernel's own arguments (its query count is one), or the plain kernel's query count.
    let n_rot = match &b.fresh {
        Some(f) => ints(f.rope.n_rot, "n_rot")?,
        None => 0,
    };
    let neox = b
        .fresh
        .as_ref()
        .map_or(0, |f| i32::from(f.rope.style == RopeStyle::Neox));
    let (no_norm, no_eps) = (0u64, 0f32);
    match &b.fresh {
        Some(f) => {
            l.arg(&f.k).arg(&f.v).arg(&f.cache_row).arg(&n_rot);
            l.arg(&f.rope.freq_base).arg(&f.rope.freq_scale).arg(&neox);
            match &f.head_norms {
                Some((qn, kn, eps)) => l.arg(qn).arg(kn).arg(eps),
                None => l.arg(&no_norm).arg(&no_norm).arg(&no_eps),
            }
        }
        None => l.arg(&n_t).arg(&group_tiles),
    };
    // SAFETY: the arguments match the kernel's signature in order and type, and every buffer holds
    // what the grid reads or writes (checked above).
    driver(&name, unsafe { l.launch(launch_cfg(grid, ATT_THREADS as u32)) })?;
    Ok(())
}

/// The merge's heads merged together, the format it quantizes the output to, and the buffer it writes
/// that into (`CudaModel::merge_output`).
pub(crate) type MergeOutput = (usize, Option<ActQuant>, Option<DevBuf<u8>>);

/// The output's quantized form the merge wrote, kept with it for the matmul that reads it.
pub(crate) fn keep_quantized(out: &GpuAct, quant: Option<ActQuant>, a: Option<DevBuf<u8>>) {
    if let (Some(fmt), Some(a)) = (quant, a) {
        out.int8.borrow_mut().push((fmt, a));
    }
}

/// `routes::decode_attention_heads`, or `TANDEM_CUDA_DECODE_HEADS` (where the kernel has that form for
/// the shape), which exists to measure the choice.
pub(crate) fn decode_heads(gpu: &Gpu, s: &TileShape) -> usize {
    match gpu.options.lab.decode_heads {
        Some(nh) if routes::decode_attention_heads_fit(s.n_head, s.n_kv_head, s.head_dim, nh) => nh,
        _ => routes::decode_attention_heads(s.n_head, s.n_kv_head, s.head_dim),
    }
}

/// `routes::decode_attention_splits` on this GPU for the heads of all `s.t` rows (one wave of blocks
/// is shared by every row of a batched step), or `TANDEM_CUDA_DECODE_SPLITS` (blocks a head, capped
/// at the tiles the grid spans; a large number gives a block per tile), which exists to measure the
/// choice.
pub(crate) fn decode_splits(gpu: &Gpu, s: &TileShape) -> usize {
    match gpu.options.lab.decode_splits {
        Some(n) => n.clamp(1, s.tile_cap.max(1)),
        None => {
            let heads = s.n_head * s.t.max(1);
            routes::decode_attention_splits(s.tile_cap, heads, s.head_dim, gpu.sm_count as usize)
        }
    }
}

/// A `rope_kv_store` launch's shape: `rows` rows of `n_head` query heads and `n_kv_head` KV heads of
/// `head_dim`, rotated by `rope`.
#[derive(Clone, Copy, Debug)]
pub struct RopeStoreShape {
    pub rows: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub rope: RopeParams,
}

impl RopeStoreShape {
    /// What `rope_kv_store` and `split_rope_kv_store` take after their buffers.
    fn kernel_args(&self) -> Result<RopeArgs, CudaError> {
        RopeArgs::new(self.rows, self.n_head, self.n_kv_head, self.head_dim, &self.rope)
    }
}

/// Its buffers: `q` (rotated in place), the rows' unrotated `k` and `v` (f32), the cache (`kc`, `vc`:
/// f16 bits), each row's cache row `dst` (-1: not stored) and position `pos`. The rows in `dst` are
/// device data, so the launch cannot check them: they must lie within the cache.
pub struct RopeStoreBuffers<'a> {
    pub q: CudaViewMut<'a, f32>,
    pub k: CudaView<'a, f32>,
    pub v: CudaView<'a, f32>,
    pub kc: CudaViewMut<'a, u16>,
    pub vc: CudaViewMut<'a, u16>,
    pub dst: CudaView<'a, i32>,
    pub pos: CudaView<'a, i32>,
}

/// The `rope_kv_store` kernel (`kernels/ops.cu`): RoPE on every row of q (in place) and of K, whose
/// rotated rows go with V's to their cache rows. The chunked route's form of what the fused decode
/// kernel does in one launch, so `tandem gpu-check` compares the two bit for bit.
pub fn rope_kv_store_into(gpu: &Gpu, s: &RopeStoreShape, b: RopeStoreBuffers<'_>) -> Result<(), CudaError> {
    let (qw, kvw) = (s.n_head * s.head_dim, s.n_kv_head * s.head_dim);
    let cache_rows = b.kc.len().min(b.vc.len()) / kvw.max(1);
    let fits = b.q.len() >= s.rows * qw
        && b.k.len().min(b.v.len()) >= s.rows * kvw
        && b.dst.len().min(b.pos.len()) >= s.rows
        && cache_rows > 0
        && s.rope.n_rot.is_multiple_of(2)
        && s.rope.n_rot <= s.head_dim;
    if !fits {
        return Err(CudaError::Driver {
            what: "rope_kv_store".into(),
            err: format!(
                "{} rows of {} + {} heads of {} (n_rot {}) with {} q, {} k, {} v, {} cache and {} row values",
                s.rows,
                s.n_head,
                s.n_kv_head,
                s.head_dim,
                s.rope.n_rot,
                b.q.len(),
                b.k.len(),
                b.v.len(),
                b.kc.len().min(b.vc.len()),
                b.dst.len().min(b.pos.len())
            ),
        });
    }
    let n = s.rows * (s.n_head + s.n_kv_head) * (s.rope.n_rot / 2);
    let tail = s.kernel_args()?;
    let (mut q, mut kc, mut vc) = (b.q, b.kc, b.vc);
    let f = gpu.function("rope_kv_store")?;
    let mut l = gpu.launch_builder(f)?;
    l.arg(&mut q)
        .arg(&b.k)
        .arg(&b.v)
        .arg(&mut kc)
        .arg(&mut vc)
        .arg(&b.dst)
        .arg(&b.pos);
    tail.push(&mut l);
    // SAFETY: the arguments match the kernel's signature in order and type, and every buffer holds
    // its rows (checked above); the cache rows in `dst` are the caller's placement's, within the cache.
    driver("rope_kv_store", unsafe {
        l.launch(launch_cfg((blocks(n, 128), 1, 1), 128))
    })?;
    Ok(())
}

/// The `kv_store` kernel (`kernels/ops.cu`): `rows` rows of K and V (f32, `width` wide) to f16 cache
/// rows `dst` (-1: skipped), which must lie within the cache (device data, not checked here).
pub fn kv_store_into(
    gpu: &Gpu,
    (k, v): (&CudaView<'_, f32>, &CudaView<'_, f32>),
    (kc, vc): (&mut CudaSlice<u16>, &mut CudaSlice<u16>),
    dst: &CudaView<'_, i32>,
    rows: usize,
    width: usize,
) -> Result<(), CudaError> {
    if k.len().min(v.len()) < rows * width || dst.len() < rows || kc.len().min(vc.len()) < width {
        return Err(CudaError::Driver {
            what: "kv_store".into(),
            err: format!(
                "{rows} rows of {width} with {} K, {} V, {} rows listed",
                k.len(),
                v.len(),
                dst.len()
            ),
        });
    }
    let wi = i32_of(width, "kv width")?;
    let f = gpu.function("kv_store")?;
    let mut b = gpu.launch_builder(f)?;
    b.arg(k).arg(v).arg(kc).arg(vc).arg(dst).arg(&wi);
    // SAFETY: the arguments match the kernel's signature in order and type; the rows read are within
    // K and V (checked above) and the caller's `dst` rows within the cache.
    driver("kv_store", unsafe { b.launch(launch_cfg((rows as u32, 1, 1), 256)) })?;
    Ok(())
}

/// `split_rope_kv_store`'s buffers: a chunk's stacked q|k|v products `qkv` (rows of `n_head +
/// 2 n_kv_head` heads), the rows' rotated q out, the cache (`kc`, `vc`: f16 bits), each row's cache
/// row `dst` (-1: not stored) and position `pos`. As for `rope_kv_store`, the rows in `dst` must lie
/// within the cache.
pub struct SplitRopeStoreBuffers<'a> {
    pub qkv: CudaView<'a, f32>,
    pub q: CudaViewMut<'a, f32>,
    pub kc: CudaViewMut<'a, u16>,
    pub vc: CudaViewMut<'a, u16>,
    pub dst: CudaView<'a, i32>,
    pub pos: CudaView<'a, i32>,
}

/// The `split_rope_kv_store` kernel (`kernels/ops.cu`): a prefill chunk's stacked products cut into
/// q, rotated, and K and V rotated and stored, with the bits of `split_columns`, `rope` and `kv_store`
/// in turn (`tandem gpu-check` compares them).
pub fn split_rope_kv_store_into(gpu: &Gpu, s: &RopeStoreShape, b: SplitRopeStoreBuffers<'_>) -> Result<(), CudaError> {
    let (qw, kvw) = (s.n_head * s.head_dim, s.n_kv_head * s.head_dim);
    let fits = b.q.len() >= s.rows * qw
        && b.qkv.len() >= s.rows * (qw + 2 * kvw)
        && b.dst.len().min(b.pos.len()) >= s.rows
        && b.kc.len().min(b.vc.len()) >= kvw
        && s.rope.n_rot >= 2
        && s.rope.n_rot.is_multiple_of(2)
        && s.rope.n_rot <= s.head_dim;
    if !fits {
        return Err(CudaError::Driver {
            what: "split_rope_kv_store".into(),
            err: format!(
                "{} rows of {} + 2 x {} heads of {} (n_rot {}) with {} stacked, {} q, {} cache and {} row values",
                s.rows,
                s.n_head,
                s.n_kv_head,
                s.head_dim,
                s.rope.n_rot,
                b.qkv.len(),
                b.q.len(),
                b.kc.len().min(b.vc.len()),
                b.dst.len().min(b.pos.len())
            ),
        });
    }
    let n = s.rows * (s.n_head + s.n_kv_head).div_ceil(crate::rows::ROPE_HEADS) * (s.rope.n_rot / 2);
    // The kernel's thread index is 32-bit.
    i32_of(n, "threads")?;
    let tail = s.kernel_args()?;
    let (mut q, mut kc, mut vc) = (b.q, b.kc, b.vc);
    let f = gpu.function("split_rope_kv_store")?;
    let mut l = gpu.launch_builder(f)?;
    l.arg(&b.qkv)
        .arg(&mut q)
        .arg(&mut kc)
        .arg(&mut vc)
        .arg(&b.dst)
        .arg(&b.pos);
    tail.push(&mut l);
    // SAFETY: the arguments match the kernel's signature in order and type, and every buffer holds
    // its rows (checked above, the thread count within the kernel's 32-bit index); the cache rows in
    // `dst` are the caller's placement's, within the cache.
    driver("split_rope_kv_store", unsafe {
        l.launch(launch_cfg((blocks(n, 128), 1, 1), 128))
    })?;
    Ok(())
}

/// The fused decode step's inputs on the model's side: the projections' K and V rows, the staged cache
/// row, and the layer's RoPE.
struct FreshInputs<'a> {
    k: &'a GpuAct,
    v: &'a GpuAct,
    cache_row: Param,
    rope: RopeParams,
    /// The q and k head norms' weights (QK-norm).
    head_norms: Option<(&'a CudaSlice<f32>, &'a CudaSlice<f32>)>,
}

impl CudaModel {
    /// `routes::attention_group_tiles` for a chunk of `t` queries on this GPU, or, for chunks,
    /// `TANDEM_CUDA_GROUP_TILES` (1: always a block per KV head; a large number: never), which exists
    /// to measure the threshold.
    fn attention_group_tiles(&self, t: usize, n_head: usize) -> usize {
        match self.gpu.options.lab.group_tiles {
            Some(tiles) if t > 1 => tiles,
            _ => routes::attention_group_tiles(t, n_head, self.gpu.sm_count as usize),
        }
    }

    /// Tiles a single query can span in a layer (the graph's fixed attention grid).
    pub(crate) fn tile_cap(&self, kv: &GpuSequenceKv, window: Option<usize>) -> usize {
        window.unwrap_or(kv.n_ctx).div_ceil(ATT_TILE) + 1
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attend_from(
        &self,
        io: &mut AttendRows<'_, GpuAct>,
        rows: &Range<usize>,
        kc: &CudaSlice<u16>,
        vc: &CudaSlice<u16>,
        source: (usize, usize, usize),
        positions: &[usize],
        window: Option<usize>,
        tile_cap: usize,
        quant: Option<ActQuant>,
    ) -> Result<(), CudaError> {
        let t = rows.len();
        // Prefill chunks (never captured, so only in direct launches) take the tensor cores when their
        // keys are contiguous in this buffer.
        if self.mode.get() == Mode::Normal && routes::attention_route(t, self.deterministic) == AttentionRoute::Flash {
            if let Some(keys) = key_range(positions, window, source) {
                return self.profiled("attend (flash)", || {
                    self.attend_flash(io.q, io.out, rows, kc, vc, keys, positions, window)
                });
            }
        }
        let cache = KvCache::Read(kc.as_view(), vc.as_view());
        self.attend_tiles(io, rows, cache, source, positions, window, tile_cap, quant, None)
    }

    /// The tile kernel over `cache` (`source` = capacity, origin_logical, origin_physical), or the
    /// fused decode kernel when `fresh` brings the step's own row.
    #[allow(clippy::too_many_arguments)]
    fn attend_tiles(
        &self,
        io: &mut AttendRows<'_, GpuAct>,
        rows: &Range<usize>,
        cache: KvCache<'_>,
        source: (usize, usize, usize),
        positions: &[usize],
        window: Option<usize>,
        tile_cap: usize,
        quant: Option<ActQuant>,
        fresh: Option<FreshInputs<'_>>,
    ) -> Result<(), CudaError> {
        let c = &self.cpu.config;
        let (capacity, origin_logical, origin_physical) = source;
        let t = rows.len();
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
        let (group, quant, mut a) = self.merge_output(quant, t)?;
        let shape = TileShape {
            t,
            n_head: c.n_head,
            n_kv_head: c.n_kv_head,
            head_dim: hd,
            scale: c.attn_scale,
            window,
            capacity,
            tile_cap,
            group,
            quant: quant.map_or(0, quant_flag),
            group_tiles: self.attention_group_tiles(t, c.n_head),
        };
        let mut arrivals = self.arrivals(t * c.n_head)?;
        let fresh = match &fresh {
            Some(f) => Some(FreshRow {
                k: f.k.buf()?.as_view(),
                v: f.v.buf()?.as_view(),
                cache_row: self.view(&f.cache_row),
                rope: f.rope,
                head_norms: f.head_norms.map(|(q, k)| (q.as_view(), k.as_view(), c.eps)),
            }),
            None => None,
        };
        let kernel = if fresh.is_some() {
            "attend (rope + tiles)"
        } else {
            "attend (tiles)"
        };
        let bufs = TileBuffers {
            q: io.q.buf()?.slice(rows.start * qw..rows.end * qw),
            cache,
            pos: self.view(&pos),
            meta: self.view(&meta),
            partial: partial.buf_mut()?,
            arrivals: &mut arrivals,
            out: io.out.buf_mut()?.slice_mut(rows.start * qw..rows.end * qw),
            quants: a.as_deref_mut(),
            fresh,
        };
        self.launch_attention(kernel, || tile_attention_into(&self.gpu, &shape, bufs))?;
        keep_quantized(io.out, quant, a);
        Ok(())
    }

    /// How the merge writes the output for the next matmul (`routes::attention_merge` of the format
    /// that matmul wants, `want`): the heads merged together, the format, and a buffer for `t` rows.
    pub(crate) fn merge_output(&self, want: Option<ActQuant>, t: usize) -> Result<MergeOutput, CudaError> {
        let c = &self.cpu.config;
        let qw = c.q_width();
        let (group, quant) = routes::attention_merge(want, qw, c.head_dim);
        let may_allocate = self.mode.get() == Mode::Normal;
        let a = match quant {
            Some(fmt) => Some(self.u8_pool.take(&self.gpu, fmt.bytes(t, qw), may_allocate)?),
            None => None,
        };
        Ok((group, quant, a))
    }

    /// An attention kernel's launch, profiled as `kernel`, or skipped (`TANDEM_CUDA_SKIP`).
    pub(crate) fn launch_attention(
        &self,
        kernel: &str,
        launch: impl FnOnce() -> Result<(), CudaError>,
    ) -> Result<(), CudaError> {
        self.profiled(kernel, || {
            if self.skips("attend_tiles") {
                return Ok(());
            }
            launch()
        })
    }

    /// The attention kernel's arrival counters, at least `n` of them (zero between launches: the
    /// merging block resets its own). Grown outside captures only: a decode step's count is set by
    /// the direct step before its graph is captured.
    pub(crate) fn arrivals(&self, n: usize) -> Result<RefMut<'_, CudaSlice<i32>>, CudaError> {
        let mut a = self.arrivals.borrow_mut();
        if a.len() < n {
            if self.mode.get() == Mode::Capture {
                return Err(CudaError::Driver {
                    what: "attention arrival counters".into(),
                    err: format!("{n} needed while capturing a graph, {} allocated", a.len()),
                });
            }
            // Graphs captured earlier keep the old counters' address: they stay allocated (and zero
            // between launches) for those graphs' replays, never freed for reuse by other buffers.
            let old = std::mem::replace(&mut *a, self.gpu.alloc::<i32>(n)?);
            self.retired_arrivals.borrow_mut().push(old);
        }
        Ok(a)
    }

    /// Converts rows of K and V to f16 into `kc`/`vc` at rows `dst` (-1: skip).
    pub(crate) fn store(
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
        let dst_v = self.view(&dst);
        self.profiled("kv_store", || {
            kv_store_into(&self.gpu, (&kv, &vv), (kc, vc), &dst_v, rows.len(), w)
        })
    }

    /// What an attention call over `rows` of layer `layer` needs besides its rows: the quantized form
    /// the merge writes for the output projection, the layer's window, and the tile grid's cap.
    fn attend_setup(
        &self,
        layer: usize,
        kv: &GpuSequenceKv,
        out_rows: usize,
        rows: &Range<usize>,
    ) -> (Option<ActQuant>, Option<usize>, usize) {
        let t = rows.len();
        // When this call writes every row of the output, the attention kernel quantizes it for the
        // output projection's integer kernel (one launch fewer).
        let whole = rows.start == 0 && rows.end == out_rows;
        let quant = whole
            .then(|| self.int8_input(&self.cpu.weights.layers[layer].wo.name, t))
            .flatten();
        let window = kv.layers[layer].window;
        // One query spans at most `tile_cap` tiles: decode steps keep one grid, so a graph replays.
        let tile_cap = if t == 1 { self.tile_cap(kv, window) } else { 0 };
        (quant, window, tile_cap)
    }

    /// `Backend::rope_store_and_attend`. One span of one row (a decode step) whose row the cache takes
    /// in place: the fused tile kernel (`attend_rope_d*`) rotates q and K, stores K and V and attends,
    /// in one launch. One span of a few rows taken in place: `rope_kv_store` rotates q in place and K
    /// on its way into the cache, then the tile kernel attends (a row's query reads the rows before it
    /// in its chunk, which other blocks store). Several spans of one row each, all taken in place (a
    /// batched decode step): the fused kernel's batched form, one launch for every sequence
    /// (`attend_decode_rows`). Anything else: `rope_qk`, then each span's `store_and_attend`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rope_store_attend(
        &self,
        scratch: &mut GpuScratch,
        layer: usize,
        spans: &mut [Span<GpuSequenceKv>],
        span_rows: &[Range<usize>],
        qkv: QkvRows<'_, GpuAct>,
        positions: &[usize],
        rope: &RopeParams,
    ) -> Result<(), ModelError> {
        if self.takes_decode_rows(layer, spans, span_rows, qkv.q.rows, rope) {
            return self.attend_decode_rows(layer, spans, qkv, positions, rope);
        }
        // The routes below take each span's caches as kernel arguments: a batched graph holding them
        // would write another batch's rows into these sequences' caches.
        if spans.len() > 1 && self.mode.get() != Mode::Normal {
            return Err(ModelError::Kernel(
                "a batched decode graph needs every row on the batched attention kernel".into(),
            ));
        }
        let fused = match (&*spans, span_rows) {
            ([span], [rows]) => {
                let lc = &span.kv.layers[layer];
                rows.len() <= MATVEC_MAX_ROWS
                    && rows.len() == qkv.q.rows
                    && rope.n_rot.is_multiple_of(2)
                    && routes::kv_route(&lc.placement, rows.len(), lc.window) == KvRoute::InPlace
            }
            _ => false,
        };
        if !fused {
            return graph::rope_then_attend_each(self, scratch, layer, spans, span_rows, qkv, positions, rope);
        }
        let kv = &mut *spans[0].kv;
        let rows = span_rows[0].clone();
        let (quant, window, tile_cap) = self.attend_setup(layer, kv, qkv.out.rows, &rows);
        let lc = &mut kv.layers[layer];
        let (dst, after) = routes::store_rows(&lc.placement, rows.len());
        // One row: the attention kernel applies the head norms and RoPE and stores the row itself (one
        // launch). More: the head norms, then `rope_kv_store`.
        let fresh_row = if rows.len() == 1 {
            Some(self.param_ints(dst)?)
        } else {
            if let Some(n) = qkv.head_norms {
                graph::norm_heads(self, qkv.q, qkv.k, n)?;
            }
            self.rope_kv_store(qkv.q, qkv.k, qkv.v, dst, (&mut lc.k, &mut lc.v), positions, rope)?;
            None
        };
        lc.placement = after;
        let p = lc.placement;
        let source = (p.capacity, p.origin_logical, p.origin_physical);
        let mut io = AttendRows {
            q: &*qkv.q,
            k: &*qkv.k,
            v: qkv.v,
            out: qkv.out,
        };
        match fresh_row {
            Some(cache_row) => {
                let fresh = FreshInputs {
                    k: io.k,
                    v: io.v,
                    cache_row,
                    rope: *rope,
                    head_norms: match qkv.head_norms {
                        Some(n) => Some((self.norm(n.q)?, self.norm(n.k)?)),
                        None => None,
                    },
                };
                let cache = KvCache::Write(lc.k.as_view_mut(), lc.v.as_view_mut());
                self.attend_tiles(
                    &mut io,
                    &rows,
                    cache,
                    source,
                    positions,
                    window,
                    tile_cap,
                    quant,
                    Some(fresh),
                )?;
            }
            None => self.attend_from(&mut io, &rows, &lc.k, &lc.v, source, positions, window, tile_cap, quant)?,
        }
        Ok(())
    }

    /// The `rope_kv_store` kernel (`rope_kv_store_into`) on the model's rows.
    #[allow(clippy::too_many_arguments)]
    fn rope_kv_store(
        &self,
        q: &mut GpuAct,
        k: &GpuAct,
        v: &GpuAct,
        dst: Vec<i32>,
        cache: (&mut CudaSlice<u16>, &mut CudaSlice<u16>),
        positions: &[usize],
        rope: &RopeParams,
    ) -> Result<(), ModelError> {
        let dst = self.param_ints(dst)?;
        let pos = self.param(positions, "position")?;
        if self.dry() || self.skips("rope_kv_store") {
            return Ok(());
        }
        let shape = RopeStoreShape {
            rows: q.rows,
            n_head: q.width / self.cpu.config.head_dim,
            n_kv_head: k.width / self.cpu.config.head_dim,
            head_dim: self.cpu.config.head_dim,
            rope: *rope,
        };
        let (kc, vc) = cache;
        let bufs = RopeStoreBuffers {
            q: q.buf_mut()?.as_view_mut(),
            k: k.buf()?.as_view(),
            v: v.buf()?.as_view(),
            kc: kc.as_view_mut(),
            vc: vc.as_view_mut(),
            dst: self.view(&dst),
            pos: self.view(&pos),
        };
        self.profiled("rope + kv_store", || rope_kv_store_into(&self.gpu, &shape, bufs))?;
        Ok(())
    }

    /// `Backend::store_and_attend`.
    pub(crate) fn store_kv_and_attend(
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
            let (quant, window, tile_cap) = self.attend_setup(layer, kv, io.out.rows, &rows);
            let lc = &mut kv.layers[layer];
            match routes::kv_route(&lc.placement, t, window) {
                KvRoute::InPlace => {
                    let (dst, after) = routes::store_rows(&lc.placement, t);
                    self.store(&io, &rows, dst, &mut lc.k, &mut lc.v)?;
                    lc.placement = after;
                    let p = lc.placement;
                    let source = (p.capacity, p.origin_logical, p.origin_physical);
                    self.attend_from(&mut io, &rows, &lc.k, &lc.v, source, positions, window, tile_cap, quant)?;
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
                        let mut b = self.gpu.launch_builder(f)?;
                        b.arg(&lc.k).arg(&lc.v).arg(&src_v).arg(&mut ks).arg(&mut vs).arg(&wi);
                        self.profiled("kv_gather", || {
                            driver("kv_gather", unsafe {
                                b.launch(launch_cfg((gather.len() as u32, 1, 1), 256))
                            })
                        })?;
                    }
                    let staged: Vec<i32> = (gather.len()..n).map(|r| r as i32).collect();
                    self.store(&io, &rows, staged, &mut ks, &mut vs)?;
                    self.attend_from(&mut io, &rows, &ks, &vs, (n, first, 0), positions, window, 0, quant)?;
                    // Committed only after attention consumed the staged rows.
                    let (dst, after) = routes::store_rows(&lc.placement, t);
                    self.store(&io, &rows, dst, &mut lc.k, &mut lc.v)?;
                    lc.placement = after;
                }
            }
            Ok(())
        }
    }
}
