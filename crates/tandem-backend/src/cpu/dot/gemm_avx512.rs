//! AVX-512 VNNI GEMM for quantized weights: each output tile is `MR` weight rows × `NR` groups
//! of 16 activation rows, held in registers.
//!
//! The 16 lanes of a vector are 16 activation rows ("lanes = activations"). Activations are packed
//! so that one 64-byte load gives 4 consecutive quants of each of the 16 rows; the matching 4
//! weight bytes are broadcast, and one `vpdpbusd` (unsigned weight bytes × signed activation
//! bytes, summed in fours into i32 lanes) advances 16 dot products by 4 elements. Each lane ends a
//! block with the exact integer sum of its own (weight row, activation row) pair, so the float
//! combination that follows is, lane by lane, exactly the scalar chain of `avx512::dot4_legacy`
//! and `avx512::dot_kquant`: every output is bit-identical to the matrix-vector route.
//!
//! Register budget of a tile (`MR = 4`, `NR = 3`): 12 i32 block accumulators, 12 f32 output
//! accumulators, 3 activation vectors and a broadcast weight word. K-quants additionally keep a
//! per-sub-block i32 accumulator that is scaled by the sub-block scale (`vpmulld`) and folded in;
//! their offset corrections and mins are `vpdpwssd` products of the weight's i16 scale (or min)
//! pairs with the activations' 16-element sums.
//!
//! Weights are decoded once per task into unsigned bytes plus per-block metadata (a "panel");
//! the ggml offset of each type (8 for Q4_0, 32 for Q6_K, …) is folded back in through the
//! activation block sums, so no signed weight bytes are needed.

// Index loops over lanes and rows are deliberate: they mirror the vector lanes they fill.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::super::act_quant::{AVec, QuantizedActs};
use super::decode_x86::{legacy_q, KDecode, KScales};
use super::gemm_pack;
use super::layout::Legacy;

/// Activation rows per vector.
pub(crate) const LANES: usize = 16;
/// Weight rows per register tile.
pub(crate) const MR: usize = 4;
/// Activation groups (of 16 rows) per register tile.
pub(crate) const NR: usize = 3;

/// Packed bytes per 32-element block and 16-row group (`gemm_pack`): 8 steps of 64 quant bytes,
/// then 16 lanes each of `-sum` (at 512), `d` (576) and `s` (640).
const LEG_BLOCK: usize = gemm_pack::leg_block(LANES);
/// Packed bytes per 256-element super-block and 16-row group: 64 steps of 64 quant bytes, 8
/// vectors of `bsums` pairs (two i16 per lane, at 4096), then 16 lanes of `d` (4608).
const K_BLOCK: usize = gemm_pack::k_block(LANES);
const _: () = assert!(gemm_pack::leg_fields(LANES)[0] == 512 && gemm_pack::leg_fields(LANES)[1] == 576);
const _: () = assert!(gemm_pack::leg_fields(LANES)[2] == 640);
const _: () = assert!(gemm_pack::k_fields(LANES)[0] == 4096 && gemm_pack::k_fields(LANES)[1] == 4608);

/// Packs group `g` of Q8 rows for this GEMM (`gemm_pack::pack_q8` at 16 lanes).
pub(crate) fn pack_group_q8(acts: &QuantizedActs, g: usize, dst: &mut [u8]) {
    gemm_pack::pack_q8(acts, g, dst, LANES)
}

/// Packs group `g` of Q8_K rows for this GEMM.
pub(crate) fn pack_group_q8k(acts: &QuantizedActs, g: usize, dst: &mut [u8]) {
    gemm_pack::pack_q8k(acts, g, dst, LANES)
}

/// Per-super-block weight metadata of a decoded K-quant row.
#[derive(Clone, Copy, Default)]
#[repr(C, align(64))]
pub(crate) struct KMeta {
    /// Scale of each 16-element sub-block.
    pub(crate) sc: [i32; 16],
    /// i16 pairs `(-OFFSET·sc[2p], -OFFSET·sc[2p + 1])`: the offset correction against bsums.
    pub(crate) corr: [i32; 8],
    /// i16 pairs `(min[2p], min[2p + 1])`.
    pub(crate) mins: [i32; 8],
    pub(crate) d: f32,
    pub(crate) dmin: f32,
}

/// Decoded weight rows of one task: unsigned quants, plus per-block `d`/`m` (legacy) or
/// [`KMeta`] (K-quants). Reused across tasks on the same thread.
#[derive(Default)]
pub(crate) struct Panel {
    pub(crate) q: AVec<u8>,
    pub(crate) d: AVec<f32>,
    pub(crate) m: AVec<f32>,
    pub(crate) meta: Vec<KMeta>,
    /// The task's outputs, activation-major with the task's row count as stride.
    pub(crate) tile: AVec<f32>,
}

impl Panel {
    /// A destination for the task's tiles in `self.tile`: writing tiles straight into the
    /// output, whose rows are often 4 or 8 KiB apart, would pile every store of a tile into one
    /// L1 set. Returns the raw pointer to hand to [`OutTile`] and the activations spanned
    /// (`lanes` activation rows to a group).
    pub(crate) fn local_out(&mut self, spec: &TaskSpec, out: &OutTile, lanes: usize) -> OutTile {
        let acts = (spec.groups.end - spec.groups.start) * lanes;
        self.tile.resize(acts * spec.rows.len());
        let t = acts.min(out.t - spec.groups.start * lanes);
        OutTile {
            out: self.tile.as_mut_slice().as_mut_ptr(),
            rows: spec.rows.len(),
            t,
            row0: 0,
            act0: 0,
        }
    }

    /// Copies the task's outputs from `self.tile` (laid out by `local_out`) to `out`.
    ///
    /// # Safety
    /// `out` must be valid and this task's part of it not accessed elsewhere.
    pub(crate) unsafe fn flush(&self, spec: &TaskSpec, local: &OutTile, out: &OutTile, lanes: usize) {
        let n = spec.rows.len();
        let m0 = spec.groups.start * lanes;
        for (i, src) in self.tile.as_slice().chunks_exact(n).take(local.t).enumerate() {
            // SAFETY: activation m0 + i < t and rows row0..row0 + n are in bounds (contract).
            unsafe {
                let dst = out.out.add((m0 + i) * out.rows + out.row0);
                std::ptr::copy_nonoverlapping(src.as_ptr(), dst, n);
            }
        }
    }
}

/// Decodes legacy weight rows into the panel: unsigned quants (`legacy_q`) and per-block `d`, `m`.
/// Shared by the AVX2 GEMM.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn decode_legacy<T: Legacy>(rows: &[&[u8]], k: usize, p: &mut Panel) {
    let nb = k / 32;
    p.q.resize(rows.len() * k);
    p.d.resize(rows.len() * nb);
    p.m.resize(rows.len() * nb);
    let (q, d, m) = (p.q.as_mut_slice(), p.d.as_mut_slice(), p.m.as_mut_slice());
    for (r, w) in rows.iter().enumerate() {
        for (b, blk) in w.chunks_exact(T::BYTES).take(nb).enumerate() {
            let v = legacy_q::<T>(blk);
            // SAFETY: 32 bytes at (r·k + 32b) are within `q`.
            unsafe { _mm256_storeu_si256(q[r * k + 32 * b..][..32].as_mut_ptr() as *mut __m256i, v) };
            d[r * nb + b] = super::decode_x86::f16_at(blk, 0);
            m[r * nb + b] = if T::HAS_MIN {
                super::decode_x86::f16_at(blk, 2)
            } else {
                0.0
            };
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn decode_kquant<T: KDecode>(rows: &[&[u8]], k: usize, p: &mut Panel) {
    let nb = k / 256;
    p.q.resize(rows.len() * k);
    p.meta.resize(rows.len() * nb, KMeta::default());
    let q = p.q.as_mut_slice();
    for (r, w) in rows.iter().enumerate() {
        for (b, blk) in w.chunks_exact(T::BYTES).take(nb).enumerate() {
            // SAFETY: AVX2 is implied by this function's features; the block is whole.
            let (kb, qv) = unsafe { (T::scales(blk), T::quants512(blk)) };
            for (i, v) in qv.iter().enumerate() {
                let dst = &mut q[r * k + 256 * b + 64 * i..][..64];
                // SAFETY: 64 bytes in bounds.
                unsafe { _mm512_storeu_si512(dst.as_mut_ptr() as *mut _, *v) };
            }
            p.meta[r * nb + b] = kmeta::<T>(&kb);
        }
    }
}

/// A super-block's [`KMeta`] from its decoded scales. Shared by the AVX2 GEMM.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn kmeta<T: KDecode>(kb: &KScales) -> KMeta {
    let (mut sc, mut mins) = ([0i16; 16], [0i16; 16]);
    // SAFETY: 16 i16 each.
    unsafe {
        _mm256_storeu_si256(sc.as_mut_ptr() as *mut __m256i, kb.scales);
        _mm256_storeu_si256(mins.as_mut_ptr() as *mut __m256i, kb.mins);
    }
    let pair = |a: i32, b: i32| (a as u16 as u32 | ((b as u16 as u32) << 16)) as i32;
    let off = T::OFFSET as i32;
    KMeta {
        sc: sc.map(|v| v as i32),
        corr: std::array::from_fn(|i| pair(-off * sc[2 * i] as i32, -off * sc[2 * i + 1] as i32)),
        mins: std::array::from_fn(|i| pair(mins[2 * i] as i32, mins[2 * i + 1] as i32)),
        d: kb.d,
        dmin: kb.dmin,
    }
}

/// Where a tile's results go: `out[m * rows + j]` for activation row `m` and weight row `j`,
/// skipping rows past `rows` and activations past `t` (padding).
#[derive(Clone, Copy)]
pub(crate) struct OutTile {
    pub out: *mut f32,
    pub rows: usize,
    pub t: usize,
    pub row0: usize,
    pub act0: usize,
}

// SAFETY: a pointer bundle; tasks write disjoint tiles through it (see `store`).
unsafe impl Send for OutTile {}
unsafe impl Sync for OutTile {}

impl OutTile {
    /// The same destination, for the tile starting at weight row `row0`.
    pub(crate) fn at_row(&self, row0: usize) -> OutTile {
        OutTile { row0, ..*self }
    }

    /// Writes a tile: `acc[r][n]` lane `l` is weight row `row0 + r`, activation row
    /// `act0 + 16n + l`.
    ///
    /// # Safety
    /// `out` must be valid for `t * rows` floats and this tile's part not accessed elsewhere.
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq,avx2,fma,f16c")]
    unsafe fn store<const NRT: usize>(&self, acc: &[[__m512; NRT]; MR]) {
        const { assert!(MR == 4) };
        for n in 0..NRT {
            let m0 = self.act0 + n * LANES;
            if self.row0 + MR <= self.rows && m0 + LANES <= self.t {
                // Transpose 4 rows × 16 lanes so each activation row gets its 4 outputs as one
                // 16-byte store: after the unpacks, 128-bit lane q of u[e] is activation 4q + e.
                let (v0, v1, v2, v3) = (acc[0][n], acc[1][n], acc[2][n], acc[3][n]);
                let t0 = _mm512_unpacklo_ps(v0, v1);
                let t1 = _mm512_unpackhi_ps(v0, v1);
                let t2 = _mm512_unpacklo_ps(v2, v3);
                let t3 = _mm512_unpackhi_ps(v2, v3);
                let pd = |a: __m512, b: __m512, hi: bool| {
                    let (a, b) = (_mm512_castps_pd(a), _mm512_castps_pd(b));
                    _mm512_castpd_ps(if hi {
                        _mm512_unpackhi_pd(a, b)
                    } else {
                        _mm512_unpacklo_pd(a, b)
                    })
                };
                let u = [pd(t0, t2, false), pd(t0, t2, true), pd(t1, t3, false), pd(t1, t3, true)];
                // SAFETY (stores): rows row0..row0 + 4 and activations m0..m0 + 16 are in bounds.
                let at = |m: usize| unsafe { self.out.add(m * self.rows + self.row0) };
                for (e, u) in u.iter().enumerate() {
                    unsafe {
                        _mm_storeu_ps(at(m0 + e), _mm512_castps512_ps128(*u));
                        _mm_storeu_ps(at(m0 + 4 + e), _mm512_extractf32x4_ps::<1>(*u));
                        _mm_storeu_ps(at(m0 + 8 + e), _mm512_extractf32x4_ps::<2>(*u));
                        _mm_storeu_ps(at(m0 + 12 + e), _mm512_extractf32x4_ps::<3>(*u));
                    }
                }
                continue;
            }
            // Edge tile: element by element, skipping padding.
            for (r, acc) in acc.iter().enumerate() {
                let j = self.row0 + r;
                if j >= self.rows {
                    break;
                }
                let mut lanes = [0.0f32; LANES];
                // SAFETY: 16 floats.
                unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), acc[n]) };
                for (l, &x) in lanes.iter().enumerate() {
                    let m = m0 + l;
                    if m < self.t {
                        // SAFETY: in bounds per the function contract.
                        unsafe { *self.out.add(m * self.rows + j) = x };
                    }
                }
            }
        }
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn bcast_u32(p: *const u8) -> __m512i {
    // SAFETY: the caller guarantees 4 readable bytes.
    _mm512_set1_epi32(unsafe { (p as *const i32).read_unaligned() })
}

/// One `MR × (NRT·16)` legacy tile over all `nb` blocks. (Hot loops avoid closures and
/// iterator adapters: those would not inherit this function's target features.)
///
/// # Safety
/// Pointers must cover `nb` blocks: `q[r]` 32·nb bytes, `d[r]`/`m[r]` nb floats, `a[n]`
/// `nb · LEG_BLOCK` packed bytes (64-byte aligned).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn tile_legacy<T: Legacy, const NRT: usize>(
    q: [*const u8; MR],
    d: [*const f32; MR],
    m: [*const f32; MR],
    a: [*const u8; NRT],
    nb: usize,
    dst: &OutTile,
) {
    let zero = _mm512_setzero_si512();
    let mut facc = [[_mm512_setzero_ps(); NRT]; MR];
    let mut ab = a;
    for b in 0..nb {
        // SAFETY (whole loop body): in bounds per the function contract.
        unsafe {
            let mut iacc = [[zero; NRT]; MR];
            if T::OFFSET != 0 {
                // Start from -OFFSET·Σa, so the sums come out as Σ (q - OFFSET)·a.
                for n in 0..NRT {
                    let neg = _mm512_load_si512(ab[n].add(512) as *const _);
                    let init = _mm512_sll_epi32(neg, _mm_cvtsi32_si128(T::SHIFT as i32));
                    for acc in iacc.iter_mut() {
                        acc[n] = init;
                    }
                }
            }
            for s in 0..8 {
                let mut av = [zero; NRT];
                for n in 0..NRT {
                    av[n] = _mm512_load_si512(ab[n].add(64 * s) as *const _);
                }
                for r in 0..MR {
                    let wb = bcast_u32(q[r].add(32 * b + 4 * s));
                    for n in 0..NRT {
                        iacc[r][n] = _mm512_dpbusd_epi32(iacc[r][n], wb, av[n]);
                    }
                }
            }
            for n in 0..NRT {
                let da = _mm512_load_ps(ab[n].add(576) as *const f32);
                for r in 0..MR {
                    let s = _mm512_mul_ps(_mm512_set1_ps(*d[r].add(b)), da);
                    facc[r][n] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(iacc[r][n]), facc[r][n]);
                }
                if T::HAS_MIN {
                    let sa = _mm512_load_ps(ab[n].add(640) as *const f32);
                    for r in 0..MR {
                        facc[r][n] = _mm512_fmadd_ps(_mm512_set1_ps(*m[r].add(b)), sa, facc[r][n]);
                    }
                }
                ab[n] = ab[n].add(LEG_BLOCK);
            }
        }
    }
    // SAFETY: per the function contract.
    unsafe { dst.store(&facc) };
}

/// One `MR × (NRT·16)` K-quant tile over all `nb` super-blocks. `SUB` is the sub-block length
/// the scales apply to (32 for Q4_K / Q5_K, whose 16-element scale pairs are equal; else 16).
///
/// # Safety
/// As for [`tile_legacy`], with `meta[r]` covering `nb` entries and `a[n]` `nb · K_BLOCK` bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn tile_kquant<T: KDecode, const SUB: usize, const NRT: usize>(
    q: [*const u8; MR],
    meta: [*const KMeta; MR],
    a: [*const u8; NRT],
    nb: usize,
    dst: &OutTile,
) {
    let zero = _mm512_setzero_si512();
    let mut facc = [[_mm512_setzero_ps(); NRT]; MR];
    let mut ab = a;
    for b in 0..nb {
        // SAFETY (whole loop body): in bounds per the function contract.
        unsafe {
            let mut mt: [&KMeta; MR] = [&*meta[0]; MR];
            for r in 0..MR {
                mt[r] = &*meta[r].add(b);
            }
            let mut sumi = [[zero; NRT]; MR];
            for j in 0..256 / SUB {
                let mut t = [[zero; NRT]; MR];
                for s in 0..SUB / 4 {
                    let step = j * (SUB / 4) + s;
                    let mut av = [zero; NRT];
                    for n in 0..NRT {
                        av[n] = _mm512_load_si512(ab[n].add(64 * step) as *const _);
                    }
                    for r in 0..MR {
                        let wb = bcast_u32(q[r].add(256 * b + 4 * step));
                        for n in 0..NRT {
                            t[r][n] = _mm512_dpbusd_epi32(t[r][n], wb, av[n]);
                        }
                    }
                }
                for r in 0..MR {
                    let sc = _mm512_set1_epi32(mt[r].sc[j * SUB / 16]);
                    for n in 0..NRT {
                        sumi[r][n] = _mm512_add_epi32(sumi[r][n], _mm512_mullo_epi32(t[r][n], sc));
                    }
                }
            }
            let mut summ = [[zero; NRT]; MR];
            for p in 0..8 {
                for n in 0..NRT {
                    let bp = _mm512_load_si512(ab[n].add(4096 + 64 * p) as *const _);
                    for r in 0..MR {
                        if T::OFFSET != 0 {
                            let c = _mm512_set1_epi32(mt[r].corr[p]);
                            sumi[r][n] = _mm512_dpwssd_epi32(sumi[r][n], bp, c);
                        }
                        if T::HAS_MIN {
                            let mm = _mm512_set1_epi32(mt[r].mins[p]);
                            summ[r][n] = _mm512_dpwssd_epi32(summ[r][n], bp, mm);
                        }
                    }
                }
            }
            for n in 0..NRT {
                let da = _mm512_load_ps(ab[n].add(4608) as *const f32);
                for r in 0..MR {
                    let t1 = _mm512_mul_ps(_mm512_set1_ps(mt[r].d), da);
                    facc[r][n] = _mm512_fmadd_ps(t1, _mm512_cvtepi32_ps(sumi[r][n]), facc[r][n]);
                    if T::HAS_MIN {
                        let t2 = _mm512_mul_ps(_mm512_set1_ps(mt[r].dmin), da);
                        facc[r][n] = _mm512_fnmadd_ps(t2, _mm512_cvtepi32_ps(summ[r][n]), facc[r][n]);
                    }
                }
                ab[n] = ab[n].add(K_BLOCK);
            }
        }
    }
    // SAFETY: per the function contract.
    unsafe { dst.store(&facc) };
}

/// One task's work: weight rows `rows` (ggml blocks, the last repeated to fill a tile) against
/// packed activation groups `groups` (each `group_bytes` long, starting at `packed`).
pub(crate) struct TaskSpec<'a> {
    pub rows: &'a [&'a [u8]],
    pub k: usize,
    pub packed: &'a [u8],
    pub group_bytes: usize,
    pub groups: std::ops::Range<usize>,
}

/// Runs one GEMM task for a legacy type.
///
/// # Safety
/// AVX-512 F/BW/VL/DQ/VNNI must be available; `out` must be valid for `t · rows` floats and the
/// task's output tiles accessed by no one else; `packed` 64-byte aligned.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn task_legacy<T: Legacy>(spec: &TaskSpec, panel: &mut Panel, out: OutTile) {
    let (k, nb) = (spec.k, spec.k / 32);
    // SAFETY: features per contract.
    unsafe { decode_legacy::<T>(spec.rows, k, panel) };
    let n_rows = spec.rows.len();
    let local = panel.local_out(spec, &out, LANES);
    let (q, d, m) = (panel.q.as_slice(), panel.d.as_slice(), panel.m.as_slice());
    let mut g = spec.groups.start;
    while g < spec.groups.end {
        let nrt = (spec.groups.end - g).min(NR);
        for r0 in (0..n_rows).step_by(MR) {
            let (mut qp, mut dp, mut mp) = ([q.as_ptr(); MR], [d.as_ptr(); MR], [m.as_ptr(); MR]);
            for i in 0..MR {
                let r = (r0 + i).min(n_rows - 1);
                (qp[i], dp[i], mp[i]) = (q[r * k..].as_ptr(), d[r * nb..].as_ptr(), m[r * nb..].as_ptr());
            }
            let tile = OutTile {
                row0: r0,
                act0: (g - spec.groups.start) * LANES,
                ..local
            };
            let ga = |i: usize| spec.packed[(g + i) * spec.group_bytes..].as_ptr();
            // SAFETY: the panel and packed groups cover `nb` blocks; output per contract.
            unsafe {
                match nrt {
                    3 => tile_legacy::<T, 3>(qp, dp, mp, [ga(0), ga(1), ga(2)], nb, &tile),
                    2 => tile_legacy::<T, 2>(qp, dp, mp, [ga(0), ga(1)], nb, &tile),
                    _ => tile_legacy::<T, 1>(qp, dp, mp, [ga(0)], nb, &tile),
                }
            }
        }
        g += nrt;
    }
    // SAFETY: per the function contract.
    unsafe { panel.flush(spec, &local, &out, LANES) };
}

/// Runs one GEMM task for a K-quant type; see [`task_legacy`].
///
/// # Safety
/// As for [`task_legacy`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn task_kquant<T: KDecode, const SUB: usize>(spec: &TaskSpec, panel: &mut Panel, out: OutTile) {
    let (k, nb) = (spec.k, spec.k / 256);
    // SAFETY: features per contract.
    unsafe { decode_kquant::<T>(spec.rows, k, panel) };
    let n_rows = spec.rows.len();
    let local = panel.local_out(spec, &out, LANES);
    let (q, meta) = (panel.q.as_slice(), &panel.meta);
    let mut g = spec.groups.start;
    while g < spec.groups.end {
        let nrt = (spec.groups.end - g).min(NR);
        for r0 in (0..n_rows).step_by(MR) {
            let (mut qp, mut mp) = ([q.as_ptr(); MR], [meta.as_ptr(); MR]);
            for i in 0..MR {
                let r = (r0 + i).min(n_rows - 1);
                (qp[i], mp[i]) = (q[r * k..].as_ptr(), meta[r * nb..].as_ptr());
            }
            let tile = OutTile {
                row0: r0,
                act0: (g - spec.groups.start) * LANES,
                ..local
            };
            let ga = |i: usize| spec.packed[(g + i) * spec.group_bytes..].as_ptr();
            // SAFETY: as in task_legacy.
            unsafe {
                match nrt {
                    3 => tile_kquant::<T, SUB, 3>(qp, mp, [ga(0), ga(1), ga(2)], nb, &tile),
                    2 => tile_kquant::<T, SUB, 2>(qp, mp, [ga(0), ga(1)], nb, &tile),
                    _ => tile_kquant::<T, SUB, 1>(qp, mp, [ga(0)], nb, &tile),
                }
            }
        }
        g += nrt;
    }
    // SAFETY: per the function contract.
    unsafe { panel.flush(spec, &local, &out, LANES) };
}

/// Bytes of one packed activation group.
pub(crate) fn group_bytes(kquant: bool, k: usize) -> usize {
    if kquant {
        (k / 256) * K_BLOCK
    } else {
        (k / 32) * LEG_BLOCK
    }
}
