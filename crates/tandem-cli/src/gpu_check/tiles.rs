//! The decode attention kernel (`tandem_cuda::attend`, one kernel per head size) against an f64
//! softmax on the host: fresh random queries, keys and values; every head size; grouped KV heads;
//! contexts of several tiles; windows; a ring buffer that has wrapped. Rows no query may read are NaN
//! (a key read past its mask shows up in the output), and so is the output before the launch. Each
//! query of a batch must also get the same bits alone: the kernel's sums depend on a query's position
//! and keys, never on the rows launched with it (what `--deterministic` relies on).

use anyhow::Result;
use half::f16;
use tandem_cuda::attend::{tile_attention_into, TileBuffers, TileShape};
use tandem_cuda::routes::{first_key, tile_span};
use tandem_cuda::Gpu;

use super::flash::attend_f64;
use super::{rel_err, Rng, Row};

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

pub(super) fn tile_checks(gpu: &Gpu, rng: &mut Rng, table: &mut Vec<Row>) -> Result<()> {
    let case = |head_dim, n_head, n_kv_head, positions: Vec<usize>, window, capacity, origin| Case {
        head_dim,
        n_head,
        n_kv_head,
        positions,
        window,
        capacity,
        origin,
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
    ];
    for c in &cases {
        check_case(gpu, rng, c, table)?;
    }
    Ok(())
}

/// The kernel's output for `positions` (each query's rows of `q`), from the case's buffer.
fn run(gpu: &Gpu, c: &Case, positions: &[usize], q: &[f32], k: &[f16], v: &[f16]) -> Result<Vec<f32>> {
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
        group: 1,
        quant: 0,
    };
    let ints = |v: &[usize]| v.iter().map(|&x| x as i32).collect::<Vec<i32>>();
    let q = gpu.upload(q)?;
    let bits = |x: &[f16]| x.iter().map(|h| h.to_bits()).collect::<Vec<u16>>();
    let (kc, vc) = (gpu.upload(&bits(k))?, gpu.upload(&bits(v))?);
    let pos = gpu.upload(&ints(positions))?;
    let meta = gpu.upload(&ints(&[c.origin.0, c.origin.1, span.lo, span.n]))?;
    let mut partial = gpu.upload(&vec![f32::NAN; t * c.n_head * tile_cap * (c.head_dim + 2)])?;
    let mut arrivals = gpu.alloc::<i32>(t * c.n_head)?;
    let mut out = gpu.upload(&vec![f32::NAN; t * c.n_head * c.head_dim])?;
    let bufs = TileBuffers {
        q: q.as_view(),
        kc: kc.as_view(),
        vc: vc.as_view(),
        pos: pos.as_view(),
        meta: meta.as_view(),
        partial: &mut partial,
        arrivals: &mut arrivals,
        out: out.as_view_mut(),
        quants: None,
    };
    tile_attention_into(gpu, &shape, bufs)?;
    let counters = gpu.download(&arrivals)?;
    anyhow::ensure!(
        counters.iter().all(|&a| a == 0),
        "tile attention left arrival counters set"
    );
    Ok(gpu.download(&out)?)
}

fn check_case(gpu: &Gpu, rng: &mut Rng, c: &Case, table: &mut Vec<Row>) -> Result<()> {
    let (hd, kvw, qw) = (c.head_dim, c.n_kv_head * c.head_dim, c.n_head * c.head_dim);
    let t = c.positions.len();
    let q: Vec<f32> = (0..t * qw).map(|_| rng.normal()).collect();
    // Every physical row a query may see gets random values; all others stay NaN.
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
    let out = run(gpu, c, &c.positions, &q, &k, &v)?;
    let err = rel_err(&out, &reference(c, &q, &k, &v));
    let mut alone_equal = true;
    if t > 1 {
        for (r, &p) in c.positions.iter().enumerate() {
            let one = run(gpu, c, &[p], &q[r * qw..(r + 1) * qw], &k, &v)?;
            let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<u32>>();
            alone_equal &= bits(&one) == bits(&out[r * qw..(r + 1) * qw]);
        }
    }
    table.push(Row {
        check: format!(
            "tile attention d{hd} {}/{} heads, positions {}..={hi}, window {:?}, {} rows from {:?}",
            c.n_head, c.n_kv_head, c.positions[0], c.window, c.capacity, c.origin
        ),
        result: format!("rel err {err:.2e} (bound {BOUND:.0e}); each query alone bit-equal: {alone_equal}"),
        pass: err < BOUND && alone_equal,
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
