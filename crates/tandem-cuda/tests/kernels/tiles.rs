//! The decode attention kernel (`attention::tile`, one kernel per head size) against an f64 softmax
//! on the host: fresh random queries, keys and values; every head size; grouped KV heads;
//! contexts of several tiles; windows; a ring buffer that has wrapped. Rows no query may read are NaN
//! (a key read past its mask shows up in the output), and so is the output before the launch. Each
//! query of a batch must also get the same bits alone: the kernel's sums depend on a query's position
//! and keys, never on the rows launched with it (what `--deterministic` relies on). The fused decode
//! kernel (RoPE, the cache store and attention in one launch) is checked on single queries.

use anyhow::Result;
use half::f16;
use tandem_cuda::lab::attention::tile::{
    rope_kv_store_into, tile_attention_into, FreshRow, KvCache, RopeStoreBuffers, RopeStoreShape, TileBuffers,
    TileShape,
};
use tandem_cuda::lab::ops::rows::rms_norm_into;
use tandem_cuda::lab::routes::{first_key, tile_span};
use tandem_cuda::Gpu;
use tandem_model::config::{RopeParams, RopeStyle};

use crate::common::{rel_err, Rng, Row};
use crate::flash::attend_f64;

#[test]
fn tile_attention_against_f64() {
    crate::common::run("tile attention checks", tile_checks);
}

/// One case: head size, query and KV heads, the queries' positions, the window, and the buffer:
/// `capacity` rows holding logical position `origin.0` at physical row `origin.1` (a ring when the
/// positions it holds wrap past its end).
struct Case {
    head_dim: usize,
    n_head: usize,
    n_kv_head: usize,
    positions: Vec<usize>,
    window: Option<usize>,
    capacity: usize,
    origin: (usize, usize),
    /// Heads merged together (the kernel's `group`): a group may span KV heads, or split one.
    merge_group: usize,
}

impl Case {
    fn first(&self, p: usize) -> usize {
        first_key(p, self.window).max(self.origin.0)
    }

    fn physical(&self, p: usize) -> usize {
        (self.origin.1 + p - self.origin.0) % self.capacity
    }
}

/// The kernel sums in f32 over f16 keys and values (queries rounded to f16 as the reference does);
/// random data gives relative errors near 1e-6, where a wrong mask or a lost tile gives 1e-1.
const BOUND: f64 = 1e-4;

pub(crate) fn tile_checks(gpu: &Gpu, rng: &mut Rng, table: &mut Vec<Row>) -> Result<()> {
    let case = |head_dim, n_head, n_kv_head, positions: Vec<usize>, window, capacity, origin| Case {
        head_dim,
        n_head,
        n_kv_head,
        positions,
        window,
        capacity,
        origin,
        merge_group: 1,
    };
    let cases = [
        // A decode step three tiles into the context, the buffer longer than the context.
        case(128, 8, 2, vec![300], None, 340, (0, 0)),
        // A short chunk across a tile boundary.
        case(128, 4, 4, (126..131).collect(), None, 200, (0, 0)),
        // A 512-row ring that has wrapped: it holds positions 491..1002, position p at row p % 512.
        case(256, 4, 1, vec![1000, 1001, 1002], Some(512), 512, (491, 491)),
        case(64, 9, 3, (40..48).collect(), Some(20), 64, (0, 0)),
        case(32, 2, 1, vec![1, 2], None, 8, (0, 0)),
        // Merge groups of four heads over KV heads of three: a block per KV head counts into two.
        Case {
            merge_group: 4,
            ..case(64, 12, 4, (1500..1503).collect(), None, 1600, (0, 0))
        },
    ];
    for c in &cases {
        check_case(gpu, rng, c, table)?;
    }
    let rope = |n_rot, style, freq_base| RopeParams {
        style,
        n_rot,
        freq_base,
        freq_scale: 1.0,
    };
    let (inter, neox) = (RopeStyle::Interleaved, RopeStyle::Neox);
    // The fused decode kernel: one query whose own K and V arrive unrotated.
    let fresh_cases = [
        (
            case(128, 8, 2, vec![300], None, 340, (0, 0)),
            rope(128, inter, 500_000.0),
        ),
        // The step's key alone in its tile, and alone in the context.
        (
            case(128, 4, 4, vec![128], None, 200, (0, 0)),
            rope(128, inter, 10_000.0),
        ),
        (case(128, 4, 1, vec![0], None, 16, (0, 0)), rope(128, neox, 10_000.0)),
        // The wrapped ring: position 1002 goes to row 490, over the oldest row it held.
        (
            case(256, 4, 1, vec![1002], Some(512), 512, (491, 491)),
            rope(256, neox, 1_000_000.0),
        ),
        // Part of each head rotated.
        (case(64, 9, 3, vec![47], Some(20), 64, (0, 0)), rope(32, neox, 10_000.0)),
        (case(32, 2, 1, vec![2], None, 8, (0, 0)), rope(32, inter, 10_000.0)),
        // Deep enough that a block takes several tiles in turn, two heads of a KV head (`attend_decode`
        // in attention.cu): on the H200 8 blocks a head, 37 tiles over 16 shares a pair of heads.
        (
            case(128, 32, 8, vec![4700], None, 4800, (0, 0)),
            rope(128, neox, 500_000.0),
        ),
        // A wrapped 1,536-row ring over 64 heads: 13 tiles (the first partly outside the window) over
        // 4 blocks a head, so two heads a block.
        (
            case(128, 64, 8, vec![3000], Some(1536), 1536, (1465, 1465)),
            rope(128, inter, 10_000.0),
        ),
        // A short context with merge groups of two heads (the 8B's Q8_K blocks): one tile, then two;
        // and a head of 256 over two tiles.
        (
            Case {
                merge_group: 2,
                ..case(128, 8, 2, vec![100], None, 130, (0, 0))
            },
            rope(128, neox, 500_000.0),
        ),
        (
            Case {
                merge_group: 2,
                ..case(128, 32, 8, vec![200], None, 256, (0, 0))
            },
            rope(128, neox, 500_000.0),
        ),
        (
            case(256, 4, 1, vec![250], None, 256, (0, 0)),
            rope(256, neox, 1_000_000.0),
        ),
        // Heads in merge groups of four, counted in by blocks of one head or (with fewer blocks a head
        // than tiles, `TANDEM_CUDA_DECODE_SPLITS`) of two.
        (
            Case {
                merge_group: 4,
                ..case(64, 8, 4, vec![2500], None, 2600, (0, 0))
            },
            rope(64, neox, 10_000.0),
        ),
    ];
    for (c, r) in &fresh_cases {
        check_fresh(gpu, rng, c, *r, table)?;
    }
    Ok(())
}

/// Each rotated pair of one head at position `pos`: its angle as the kernels form it (f32,
/// `rope_angle` in `common.cuh`) and the indices of its two elements.
fn rope_pairs(pos: usize, r: &RopeParams) -> impl Iterator<Item = (f32, usize, usize)> + '_ {
    let half = r.n_rot / 2;
    (0..half).map(move |p| {
        let theta = pos as f32 * r.freq_scale * r.freq_base.powf(-2.0 * p as f32 / r.n_rot as f32);
        let (a, b) = match r.style {
            RopeStyle::Neox => (p, p + half),
            RopeStyle::Interleaved => (2 * p, 2 * p + 1),
        };
        (theta, a, b)
    })
}

/// RoPE on one head's `x` at position `pos`, the angle formed as the kernels form it, rotated in f64.
fn rotate(x: &[f32], pos: usize, r: &RopeParams) -> Vec<f64> {
    let mut y: Vec<f64> = x.iter().map(|&a| a as f64).collect();
    for (theta, a, b) in rope_pairs(pos, r) {
        let (sin, cos) = (theta as f64).sin_cos();
        let (x0, x1) = (x[a] as f64, x[b] as f64);
        y[a] = x0 * cos - x1 * sin;
        y[b] = x0 * sin + x1 * cos;
    }
    y
}

/// How far each element of `rotate(x, pos, r)` may move when the angle moves by a few f32 ulps: the
/// kernel forms each angle in f32 on the device (`powf`, then `cosf` and `sinf`), the host in f32 with
/// Rust's `powf`, then f64 sines. At position 128 an angle's ulp is 7.6e-6, so a rotated element
/// near zero after cancellation (x0 cos against x1 sin) can move by more than its own f16 ulp while
/// every input is right; the slack is |x0| + |x1| times two ulps of the angle and of its sine and
/// cosine. A wrong angle, pair or row still moves an element by about |x|.
fn rotation_slack(x: &[f32], pos: usize, r: &RopeParams) -> Vec<f64> {
    let mut slack = vec![0.0; x.len()];
    for (theta, a, b) in rope_pairs(pos, r) {
        let wobble = 2.0 * (f64::from(theta.abs()) * f64::from(f32::EPSILON) + f64::from(f32::EPSILON));
        let reach = (f64::from(x[a]).abs() + f64::from(x[b]).abs()) * wobble;
        (slack[a], slack[b]) = (reach, reach);
    }
    slack
}

/// A stored K element (f16) against the host's rotation: within an f16 ulp of it, plus the angle's
/// slack (`rotation_slack`).
fn k_within(got: f16, want: f64, slack: f64) -> bool {
    (got.to_f64() - want).abs() <= want.abs() * 2f64.powi(-10) + slack + 1e-7
}

/// The fused kernel's answer on an angle the host forms to within an f32 ulp: queries rounded to
/// f16 may move by one f16 ulp, so a looser bound than the cached kernel's (a misplaced or missing
/// key still gives about 1e-1).
const FRESH_BOUND: f64 = 1e-3;

/// The fused decode kernel (`attend_rope_d*`) on one query: q, K and V of the step arrive unrotated
/// and the step's cache row is NaN (the kernel must attend to its key from the fresh row and store
/// it). Checked: the stored K row against the host's rotation (one f16 ulp, plus the angle's slack),
/// V's bits, every other row untouched, the output against f64 attention; with no rotation, the
/// output's bits against the cached kernel over a cache already holding the row; and, rotated with
/// and without QK-norm, the output's and the stored row's bits against the chunked route's kernels
/// (`rms_norm`, then `chained_route`).
fn check_fresh(gpu: &Gpu, rng: &mut Rng, c: &Case, rope: RopeParams, table: &mut Vec<Row>) -> Result<()> {
    let (hd, kvw, qw) = (c.head_dim, c.n_kv_head * c.head_dim, c.n_head * c.head_dim);
    let p = c.positions[0];
    let q: Vec<f32> = (0..qw).map(|_| rng.normal()).collect();
    let fk: Vec<f32> = (0..kvw).map(|_| rng.normal()).collect();
    let fv: Vec<f32> = (0..kvw).map(|_| rng.normal()).collect();
    let (mut k, mut v) = random_cache(c, rng);
    let row = c.physical(p) * kvw..c.physical(p) * kvw + kvw;
    k[row.clone()].fill(f16::NAN);
    v[row.clone()].fill(f16::NAN);
    let fresh = Fresh {
        k: &fk,
        v: &fv,
        rope,
        norms: None,
    };
    let (out, kc, vc) = run(gpu, c, &[p], &q, (&k, &v), Some(&fresh))?;
    let rotated = |x: &[f32]| -> Vec<f64> { x.chunks(hd).flat_map(|h| rotate(h, p, &rope)).collect() };
    // The stored row: K within an f16 ulp of the host's rotation, V bit-equal, all else untouched.
    let k_host = rotated(&fk);
    let k_slack: Vec<f64> = fk.chunks(hd).flat_map(|h| rotation_slack(h, p, &rope)).collect();
    let k_close = kc[row.clone()]
        .iter()
        .zip(k_host.iter().zip(&k_slack))
        .all(|(&b, (&want, &slack))| k_within(f16::from_bits(b), want, slack));
    let v_equal = vc[row.clone()]
        .iter()
        .zip(&fv)
        .all(|(&b, &x)| b == f16::from_f32(x).to_bits());
    let (k_in, v_in) = (f16_bits(&k), f16_bits(&v));
    let untouched = (0..kc.len()).all(|i| row.contains(&i) || (kc[i] == k_in[i] && vc[i] == v_in[i]));
    // The output against f64 attention over the kernel's own stored row.
    let (mut k_ref, mut v_ref) = (k.clone(), v.clone());
    for i in row.clone() {
        k_ref[i] = f16::from_bits(kc[i]);
        v_ref[i] = f16::from_bits(vc[i]);
    }
    let q_rot: Vec<f32> = rotated(&q).iter().map(|&x| x as f32).collect();
    let err = rel_err(&out, &reference(c, &q_rot, &k_ref, &v_ref));
    // No rotation: the fused kernel's bits are the cached kernel's over a cache holding the row.
    let still = RopeParams { n_rot: 0, ..rope };
    let (out_fused, _, _) = run(gpu, c, &[p], &q, (&k, &v), Some(&Fresh { rope: still, ..fresh }))?;
    let (mut k_cached, mut v_cached) = (k.clone(), v.clone());
    for (j, i) in row.clone().enumerate() {
        k_cached[i] = f16::from_f32(fk[j]);
        v_cached[i] = f16::from_f32(fv[j]);
    }
    let (out_cached, _, _) = run(gpu, c, &[p], &q, (&k_cached, &v_cached), None)?;
    let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    let bit_equal = same(&out_fused, &out_cached);
    // QK-norm in the kernel: the bits of `rms_norm` over each head of q and K first.
    let weights = |rng: &mut Rng| (0..hd).map(|_| 1.0 + 0.25 * rng.normal()).collect::<Vec<f32>>();
    let (qn, kn) = (weights(rng), weights(rng));
    let normed_fused = run(
        gpu,
        c,
        &[p],
        &q,
        (&k, &v),
        Some(&Fresh {
            norms: Some((&qn, &kn)),
            ..fresh
        }),
    )?;
    let normed_first = |x: &[f32], w: &[f32]| -> Result<Vec<f32>> {
        let mut d = gpu.upload(x)?;
        rms_norm_into(gpu, &mut d, x.len(), &gpu.upload(w)?, hd, HEAD_NORM_EPS)?;
        Ok(gpu.download(&d)?)
    };
    let (qn_first, kn_first) = (normed_first(&q, &qn)?, normed_first(&fk, &kn)?);
    let plain = run(
        gpu,
        c,
        &[p],
        &qn_first,
        (&k, &v),
        Some(&Fresh { k: &kn_first, ..fresh }),
    )?;
    let norm_equal = same(&normed_fused.0, &plain.0) && normed_fused.1 == plain.1 && normed_fused.2 == plain.2;
    // Rotated, with and without QK-norm: output and stored row bit-equal to the chunked route's
    // kernels (`rms_norm`, `rope_kv_store`, then the cached kernel), which form the same values in
    // launches of their own (where the compiler may contract other products: it once rotated q and K
    // to other bits in the fused kernel than in `rope` and `rope_kv_store`, hence `rope_rotate`).
    // With QK-norm the chain starts from q and K already through `rms_norm` (`normed_first`).
    let chain_equal = |(out, kc, vc): (&[f32], &[u16], &[u16]), q: &[f32], f: &Fresh<'_>| -> Result<bool> {
        let chained = chained_route(gpu, c, q, f, (&k, &v))?;
        Ok(same(out, &chained.0) && kc == chained.1 && vc == chained.2)
    };
    let rotated_equal = chain_equal((&out, &kc, &vc), &q, &fresh)?;
    let (nf_out, nf_k, nf_v) = &normed_fused;
    let normed_rotated_equal = chain_equal((nf_out, nf_k, nf_v), &qn_first, &Fresh { k: &kn_first, ..fresh })?;
    table.push(Row {
        check: format!(
            "fused RoPE + store + attention d{hd} {}/{} heads, position {p}, window {:?}, {} rows from {:?}, \
             n_rot {} {:?}",
            c.n_head, c.n_kv_head, c.window, c.capacity, c.origin, rope.n_rot, rope.style
        ),
        result: format!(
            "rel err {err:.2e} (bound {FRESH_BOUND:.0e}); stored K within an f16 ulp: {k_close}, V bit-equal: \
             {v_equal}, other rows untouched: {untouched}; unrotated bit-equal to the cached kernel: {bit_equal}; \
             QK-norm (output, K, V) bit-equal to rms_norm first: {norm_equal}; rotated (output, K, V) \
             bit-equal to rope_kv_store then the cached kernel: {rotated_equal}, with QK-norm (rms_norm \
             first): {normed_rotated_equal}"
        ),
        pass: err < FRESH_BOUND
            && k_close
            && v_equal
            && untouched
            && bit_equal
            && norm_equal
            && rotated_equal
            && normed_rotated_equal,
    });
    Ok(())
}

/// The chunked route's form of the fused step (after the head norms, which the caller applies):
/// `rope_kv_store` (q rotated in place, K rotated and stored with V to the step's cache row), then the
/// cached kernel over the cache so written. Its output and the cache's K and V after it.
fn chained_route(
    gpu: &Gpu,
    c: &Case,
    q: &[f32],
    fresh: &Fresh<'_>,
    (k, v): (&[f16], &[f16]),
) -> Result<(Vec<f32>, Vec<u16>, Vec<u16>)> {
    let (hd, p) = (c.head_dim, c.positions[0]);
    let (mut qd, kd) = (gpu.upload(q)?, gpu.upload(fresh.k)?);
    let (mut kc, mut vc) = (gpu.upload(&f16_bits(k))?, gpu.upload(&f16_bits(v))?);
    let vd = gpu.upload(fresh.v)?;
    let (dst, pos) = (gpu.upload(&[c.physical(p) as i32])?, gpu.upload(&[p as i32])?);
    let shape = RopeStoreShape {
        rows: 1,
        n_head: c.n_head,
        n_kv_head: c.n_kv_head,
        head_dim: hd,
        rope: fresh.rope,
    };
    let bufs = RopeStoreBuffers {
        q: qd.as_view_mut(),
        k: kd.as_view(),
        v: vd.as_view(),
        kc: kc.as_view_mut(),
        vc: vc.as_view_mut(),
        dst: dst.as_view(),
        pos: pos.as_view(),
    };
    rope_kv_store_into(gpu, &shape, bufs)?;
    let (q_rot, kc, vc) = (gpu.download(&qd)?, gpu.download(&kc)?, gpu.download(&vc)?);
    let halves = |x: &[u16]| x.iter().map(|&b| f16::from_bits(b)).collect::<Vec<f16>>();
    let (out, _, _) = run(gpu, c, &[p], &q_rot, (&halves(&kc), &halves(&vc)), None)?;
    Ok((out, kc, vc))
}

/// The step's own row for the fused kernel: unrotated K and V (f32, one row of KV heads) and RoPE;
/// with `norms`, the q and k head norms' weights (QK-norm, one head wide each).
#[derive(Clone, Copy)]
struct Fresh<'a> {
    k: &'a [f32],
    v: &'a [f32],
    rope: RopeParams,
    norms: Option<(&'a [f32], &'a [f32])>,
}

/// The norm's epsilon in the QK-norm check.
const HEAD_NORM_EPS: f32 = 1e-6;

/// The kernel's output for `positions` (each query's rows of `q`), from the case's buffer; with
/// `fresh` (one query), the fused kernel's output and the buffer's K and V after it.
fn run(
    gpu: &Gpu,
    c: &Case,
    positions: &[usize],
    q: &[f32],
    (k, v): (&[f16], &[f16]),
    fresh: Option<&Fresh<'_>>,
) -> Result<(Vec<f32>, Vec<u16>, Vec<u16>)> {
    run_blocks(gpu, c, positions, q, (k, v), fresh, false)
}

/// `run` with a block per query head (`by_kv_head` false) or, whatever the tile count, a block per
/// KV head taking its query heads in turn (the cached kernel; the fused one always takes one head).
fn run_blocks(
    gpu: &Gpu,
    c: &Case,
    positions: &[usize],
    q: &[f32],
    (k, v): (&[f16], &[f16]),
    fresh: Option<&Fresh<'_>>,
    by_kv_head: bool,
) -> Result<(Vec<f32>, Vec<u16>, Vec<u16>)> {
    let t = positions.len();
    let span = tile_span(positions, c.window, c.origin.0);
    // One tile more than live: blocks past the live tiles must exit without touching anything.
    let tile_cap = span.n + 1;
    let shape = TileShape {
        t,
        n_head: c.n_head,
        n_kv_head: c.n_kv_head,
        head_dim: c.head_dim,
        scale: 1.0 / (c.head_dim as f32).sqrt(),
        window: c.window,
        capacity: c.capacity,
        tile_cap,
        group: c.merge_group,
        quant: 0,
        group_tiles: if by_kv_head { 1 } else { usize::MAX },
    };
    let ints = |v: &[usize]| v.iter().map(|&x| x as i32).collect::<Vec<i32>>();
    let q = gpu.upload(q)?;
    let (mut kc, mut vc) = (gpu.upload(&f16_bits(k))?, gpu.upload(&f16_bits(v))?);
    let pos = gpu.upload(&ints(positions))?;
    let meta = gpu.upload(&ints(&[c.origin.0, c.origin.1, span.lo, span.n]))?;
    let mut partial = gpu.upload(&vec![f32::NAN; t * c.n_head * tile_cap * (c.head_dim + 2)])?;
    let mut arrivals = gpu.alloc::<i32>(t * c.n_head)?;
    let mut out = gpu.upload(&vec![f32::NAN; t * c.n_head * c.head_dim])?;
    let fresh_rows = match fresh {
        Some(f) => Some((
            gpu.upload(f.k)?,
            gpu.upload(f.v)?,
            gpu.upload(&[c.physical(positions[0]) as i32])?,
        )),
        None => None,
    };
    let norms = match fresh.and_then(|f| f.norms) {
        Some((qn, kn)) => Some((gpu.upload(qn)?, gpu.upload(kn)?)),
        None => None,
    };
    let (cache, fresh) = match (&fresh_rows, fresh) {
        (Some((fk, fv, row)), Some(f)) => (
            KvCache::Write(kc.as_view_mut(), vc.as_view_mut()),
            Some(FreshRow {
                k: fk.as_view(),
                v: fv.as_view(),
                cache_row: row.as_view(),
                rope: f.rope,
                head_norms: norms.as_ref().map(|(q, k)| (q.as_view(), k.as_view(), HEAD_NORM_EPS)),
            }),
        ),
        _ => (KvCache::Read(kc.as_view(), vc.as_view()), None),
    };
    let bufs = TileBuffers {
        q: q.as_view(),
        cache,
        pos: pos.as_view(),
        meta: meta.as_view(),
        partial: &mut partial,
        arrivals: &mut arrivals,
        out: out.as_view_mut(),
        quants: None,
        fresh,
    };
    tile_attention_into(gpu, &shape, bufs)?;
    let counters = gpu.download(&arrivals)?;
    anyhow::ensure!(
        counters.iter().all(|&a| a == 0),
        "tile attention left arrival counters set"
    );
    Ok((gpu.download(&out)?, gpu.download(&kc)?, gpu.download(&vc)?))
}

/// The bits of f16 values, as the cache buffers hold them.
fn f16_bits(x: &[f16]) -> Vec<u16> {
    x.iter().map(|h| h.to_bits()).collect()
}

/// The case's buffer: every physical row a query may see gets random values; all others stay NaN.
fn random_cache(c: &Case, rng: &mut Rng) -> (Vec<f16>, Vec<f16>) {
    let kvw = c.n_kv_head * c.head_dim;
    let (mut k, mut v) = (vec![f16::NAN; c.capacity * kvw], vec![f16::NAN; c.capacity * kvw]);
    let lo = c.positions.iter().map(|&p| c.first(p)).min().unwrap_or(0);
    let hi = c.positions.iter().copied().max().unwrap_or(0);
    for p in lo..=hi {
        let row = c.physical(p) * kvw;
        for i in row..row + kvw {
            k[i] = f16::from_f32(rng.normal());
            v[i] = f16::from_f32(rng.normal());
        }
    }
    (k, v)
}

fn check_case(gpu: &Gpu, rng: &mut Rng, c: &Case, table: &mut Vec<Row>) -> Result<()> {
    let (hd, qw) = (c.head_dim, c.n_head * c.head_dim);
    let t = c.positions.len();
    let q: Vec<f32> = (0..t * qw).map(|_| rng.normal()).collect();
    let (k, v) = random_cache(c, rng);
    let hi = c.positions.iter().copied().max().unwrap_or(0);
    let (out, _, _) = run(gpu, c, &c.positions, &q, (&k, &v), None)?;
    let err = rel_err(&out, &reference(c, &q, &k, &v));
    let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<u32>>();
    let (grouped, _, _) = run_blocks(gpu, c, &c.positions, &q, (&k, &v), None, true)?;
    let by_kv_head_equal = bits(&grouped) == bits(&out);
    let mut alone_equal = true;
    if t > 1 {
        for (r, &p) in c.positions.iter().enumerate() {
            let (one, _, _) = run(gpu, c, &[p], &q[r * qw..(r + 1) * qw], (&k, &v), None)?;
            alone_equal &= bits(&one) == bits(&out[r * qw..(r + 1) * qw]);
        }
    }
    table.push(Row {
        check: format!(
            "tile attention d{hd} {}/{} heads (merged by {}), positions {}..={hi}, window {:?}, {} rows from {:?}",
            c.n_head, c.n_kv_head, c.merge_group, c.positions[0], c.window, c.capacity, c.origin
        ),
        result: format!(
            "rel err {err:.2e} (bound {BOUND:.0e}); each query alone bit-equal: {alone_equal}; a block per KV \
             head bit-equal: {by_kv_head_equal}"
        ),
        pass: err < BOUND && alone_equal && by_kv_head_equal,
    });
    Ok(())
}

/// Softmax attention in f64 over the keys each query sees (through the buffer's placement).
fn reference(c: &Case, q: &[f32], k: &[f16], v: &[f16]) -> Vec<f64> {
    let (hd, qw, kvw) = (c.head_dim, c.n_head * c.head_dim, c.n_kv_head * c.head_dim);
    let group = c.n_head / c.n_kv_head;
    let scale = 1.0 / (hd as f64).sqrt();
    let mut out = vec![0f64; q.len()];
    for (r, &p) in c.positions.iter().enumerate() {
        for h in 0..c.n_head {
            let col = (h / group) * hd;
            let keys: Vec<usize> = (c.first(p)..=p).map(|j| c.physical(j) * kvw + col).collect();
            let at = r * qw + h * hd;
            attend_f64(&q[at..at + hd], k, v, &keys, scale, &mut out[at..at + hd]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rotated_element_near_zero_may_move_with_the_angle_but_a_wrong_angle_may_not() {
        // Position 128, pair 0: the angle is 128 rad, whose f32 ulp is 7.6e-6. With x1 chosen so
        // that x0 cos - x1 sin cancels, an angle one ulp off (as the device's f32 angle may be) moves
        // that element by far more than its own f16 ulp.
        let rope = RopeParams {
            n_rot: 2,
            freq_base: 10000.0,
            freq_scale: 1.0,
            style: RopeStyle::Interleaved,
        };
        let x0 = 1.0f32;
        let x1 = (128f64.cos() / 128f64.sin()) as f32;
        let x = [x0, x1];
        let want = rotate(&x, 128, &rope);
        let slack = rotation_slack(&x, 128, &rope);
        let device = |theta: f32| {
            let (sin, cos) = f64::from(theta).sin_cos();
            f16::from_f64(f64::from(x0) * cos - f64::from(x1) * sin)
        };
        let one_ulp_off = device(f32::from_bits(128f32.to_bits() + 1));
        assert!(!k_within(one_ulp_off, want[0], 0.0), "without the slack this fails");
        assert!(k_within(one_ulp_off, want[0], slack[0]));
        // The angle of position 127 is a wrong key's: still caught.
        assert!(!k_within(device(127.0), want[0], slack[0]));
        // Unrotated dimensions get no slack.
        let wide = rotation_slack(&[1.0, 1.0, 1.0, 1.0], 128, &rope);
        assert_eq!(&wide[2..], &[0.0, 0.0]);
    }
}
