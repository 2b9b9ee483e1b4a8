//! A batched decode step's attention: one row of each of several sequences, every row rotated,
//! stored and attended in one launch of the fused decode kernel's batched form
//! (`attend_rope_rows_*` in `kernels/attention.cu`). Each row finds its own cache through its
//! sequence's buffer table (`GpuSequenceKv::buffers`, written once when the sequence is made) and
//! brings its own placement, position and cache row, so each row has the bits its own one-row launch
//! gives (the kernel tests compare them). A launch a sequence, as before, made a step about 1 ms
//! slower for every sequence in it on the 8B.

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DevicePtr, PushKernelArg};
use tandem_model::config::{RopeParams, RopeStyle};

use crate::attention::tile::{decode_heads, decode_splits, tile_error, TileShape};
use crate::routes::{self, ATT_THREADS};
use crate::runtime::checked::driver;
use crate::runtime::grid::{i32_of, launch_cfg};
use crate::{CudaError, Gpu};

/// Ints a row of the batched decode kernel's table holds (`ROW_INTS` in `kernels/attention.cu`):
/// capacity, origin_logical, origin_physical, first tile, live tiles, position, cache row, unused.
pub const ROW_INTS: usize = 8;

/// A sequence's table of K and V buffer addresses, K then V, layer by layer (`GpuSequenceKv::buffers`):
/// how the batched decode kernel finds a row's caches.
pub fn buffer_table<'a>(
    gpu: &Gpu,
    layers: impl IntoIterator<Item = (&'a CudaSlice<u16>, &'a CudaSlice<u16>)>,
) -> Result<CudaSlice<u64>, CudaError> {
    let mut addresses = Vec::new();
    for (k, v) in layers {
        addresses.push(k.device_ptr(&gpu.stream).0);
        addresses.push(v.device_ptr(&gpu.stream).0);
    }
    if addresses.is_empty() {
        addresses.push(0);
    }
    gpu.upload(&addresses)
}

/// The rows' sequence tables (`buffer_table`) as the kernel's `seqs` argument wants them: each address
/// as two ints, low then high, so the host's integer parameters can carry them.
pub fn table_addresses<'a>(gpu: &Gpu, tables: impl IntoIterator<Item = &'a CudaSlice<u64>>) -> Vec<i32> {
    let mut ints = Vec::new();
    for t in tables {
        let address = t.device_ptr(&gpu.stream).0;
        ints.extend([address as u32 as i32, (address >> 32) as u32 as i32]);
    }
    ints
}

/// The buffers of one launch of the batched fused decode kernel (`attend_rope_rows_*`): `t` decode
/// rows, each of its own sequence. `seqs` holds each row's sequence's buffer table
/// (`GpuSequenceKv::buffers`) as an address split into two ints (low, high); `rows` each row's
/// `ROW_INTS` ints. `q`, `k`, `v`, `out`, `partial`, `arrivals` and `quants` hold `t` rows, as for the
/// tile kernel; q arrives unrotated, K and V as the projections' f32 rows (`FreshRow`).
pub struct DecodeRowsBuffers<'a> {
    pub q: CudaView<'a, f32>,
    pub seqs: CudaView<'a, i32>,
    pub layer: usize,
    pub rows: CudaView<'a, i32>,
    pub partial: &'a mut CudaSlice<f32>,
    pub arrivals: &'a mut CudaSlice<i32>,
    pub out: CudaViewMut<'a, f32>,
    pub quants: Option<&'a mut CudaSlice<u8>>,
    pub k: CudaView<'a, f32>,
    pub v: CudaView<'a, f32>,
    pub rope: RopeParams,
    pub head_norms: Option<(CudaView<'a, f32>, CudaView<'a, f32>, f32)>,
}

/// Launches the batched fused decode kernel: row r's step as `tile_attention_into` with a `FreshRow`
/// runs it alone (same blocks a head, same records and merge), for every row in one launch. The
/// caches' bounds are device data the launch cannot check: each row's cache row and placement must
/// lie within its buffers (`s.capacity` is unused; each row brings its own).
pub fn decode_rows_attention_into(gpu: &Gpu, s: &TileShape, b: DecodeRowsBuffers<'_>) -> Result<(), CudaError> {
    if !routes::head_dim_supported(s.head_dim) {
        return Err(CudaError::UnsupportedHeadDim(s.head_dim));
    }
    let (qw, kvw, t) = (s.n_head * s.head_dim, s.n_kv_head * s.head_dim, s.t);
    let need = [
        ("queries", b.q.len(), t * qw),
        ("output", b.out.len(), t * qw),
        ("rows' K and V", b.k.len().min(b.v.len()), t * kvw),
        ("sequence tables", b.seqs.len(), 2 * t),
        ("row table", b.rows.len(), ROW_INTS * t),
        (
            "partials",
            b.partial.len(),
            t * s.n_head * s.tile_cap * (s.head_dim + 2),
        ),
        ("arrival counters", b.arrivals.len(), t * s.n_head),
        (
            "head norms",
            b.head_norms
                .as_ref()
                .map_or(s.head_dim, |(q, k, _)| q.len().min(k.len())),
            s.head_dim,
        ),
        (
            "quantized output",
            if s.quant == 0 {
                t * qw
            } else {
                b.quants.as_ref().map_or(0, |a| a.len())
            },
            t * qw,
        ),
    ];
    if let Some((what, have, need)) = need.into_iter().find(|(_, have, need)| have < need) {
        return Err(CudaError::Driver {
            what: format!("batched decode attention {what}"),
            err: format!("{have} elements, {need} needed"),
        });
    }
    let groups_fit =
        s.n_kv_head > 0 && s.n_head.is_multiple_of(s.n_kv_head) && s.group > 0 && s.n_head.is_multiple_of(s.group);
    let n_rot = b.rope.n_rot;
    // A row a grid layer (gridDim.z holds at most 65,535).
    if !groups_fit || !n_rot.is_multiple_of(2) || n_rot > s.head_dim || !(1..=65_535).contains(&t) {
        return Err(tile_error(format!(
            "{t} rows, {} heads over {} KV heads in merge groups of {}, n_rot {n_rot} of head size {}",
            s.n_head, s.n_kv_head, s.group, s.head_dim
        )));
    }
    let ints = |n: usize, what: &str| i32_of(n, what);
    let (kvw_i, layer) = (ints(kvw, "kv width")?, ints(b.layer, "layer")?);
    let (nh, nkv) = (ints(s.n_head, "heads")?, ints(s.n_kv_head, "kv heads")?);
    let (win, tc) = (ints(s.window.unwrap_or(0), "window")?, ints(s.tile_cap, "tiles")?);
    let (group, n_t, n_rot) = (
        ints(s.group, "heads per group")?,
        ints(t, "rows")?,
        ints(n_rot, "n_rot")?,
    );
    let name = match decode_heads(gpu, s) {
        1 => format!("attend_rope_rows_d{}", s.head_dim),
        nh => format!("attend_rope_rows_h{nh}_d{}", s.head_dim),
    };
    let grid = (decode_splits(gpu, s) as u32, s.n_head as u32, t as u32);
    let f = gpu.function(&name)?;
    let mut l = gpu.launch_builder(f)?;
    l.arg(&b.q).arg(&b.seqs).arg(&layer).arg(&b.rows).arg(&kvw_i);
    l.arg(&nh).arg(&nkv).arg(&s.scale).arg(&win).arg(&tc);
    l.arg(b.partial).arg(b.arrivals);
    let mut out = b.out;
    l.arg(&mut out).arg(&group).arg(&s.quant);
    let no_quants = 0u64;
    match b.quants {
        Some(a) => l.arg(a),
        None => l.arg(&no_quants),
    };
    let neox = i32::from(b.rope.style == RopeStyle::Neox);
    l.arg(&b.k).arg(&b.v).arg(&n_rot);
    l.arg(&b.rope.freq_base).arg(&b.rope.freq_scale).arg(&neox);
    let (no_norm, no_eps) = (0u64, 0f32);
    match &b.head_norms {
        Some((qn, kn, eps)) => l.arg(qn).arg(kn).arg(eps),
        None => l.arg(&no_norm).arg(&no_norm).arg(&no_eps),
    };
    l.arg(&n_t);
    // SAFETY: the arguments match the kernel's signature in order and type; every buffer holds what
    // the grid reads or writes (checked above), and each row's caches are its sequence's (the caller's
    // placements keep their rows within them).
    driver(&name, unsafe { l.launch(launch_cfg(grid, ATT_THREADS as u32)) })?;
    Ok(())
}
