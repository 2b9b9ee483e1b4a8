//! The CUDA backend's attention outside the flash route (`flash.rs`): K and V stored into the
//! cache (or a staging buffer when the chunk meets a wrapped ring), then the tile kernel, whose last
//! block per query and head merges the tiles (`kernels/attention.cu`). A decode step fuses RoPE and
//! the store into the tile kernel; a batched decode step (one row of each of several sequences) runs
//! that fused kernel for every row in one launch, each row finding its own cache through its
//! sequence's buffer table.

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, PushKernelArg};
use tandem_model::config::{RopeParams, RopeStyle};

use crate::ops::rows::RopeArgs;
use crate::routes::{self, ATT_THREADS};
use crate::runtime::checked::driver;
use crate::runtime::grid::{blocks, i32_of, launch_cfg};
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
/// kernel does in one launch, so the kernel tests compare the two bit for bit.
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
/// in turn (the kernel tests compare them).
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
    let n = s.rows * (s.n_head + s.n_kv_head).div_ceil(crate::ops::rows::ROPE_HEADS) * (s.rope.n_rot / 2);
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
