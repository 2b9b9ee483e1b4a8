//! AVX2 GEMM for quantized weights: the AVX-512 GEMM's design (`gemm_avx512`) at half the width.
//! Each output tile is `MR` weight rows × `NRT` groups of 8 activation rows held in registers.
//!
//! The 8 lanes of a vector are 8 activation rows. Activations are packed so that one 32-byte
//! load gives 4 consecutive quants of each of the 8 rows; the matching 4 weight bytes are
//! broadcast, and `vpmaddubsw` + `vpmaddwd` (unsigned weight bytes × signed activation bytes, in
//! pairs to i16, then pairs to i32) advance 8 dot products by 4 elements. The i16 pair sums are
//! exact for quants below 64 (|a| <= 128, and 63·128·2 < 2^15): every K-quant and every legacy type
//! but Q8_0, whose bytes take the row kernels at this level (`dot::gemm` says why). Each lane ends a
//! block with the exact integer sum of its own (weight row, activation row) pair, so the float
//! combination that follows is, lane by lane, the canonical chain of every other level (`avx512`
//! module docs): every output is bit-identical to the row kernels' and other levels'.
//!
//! Register budget of a tile (`MR = 4`, `NRT <= 2`): 8 i32 block accumulators, 2 activation
//! vectors, a broadcast weight word and constants; the f32 output accumulators are touched once
//! per block and may live in memory.

// Index loops over lanes and rows are deliberate: they mirror the vector lanes they fill.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::super::act_quant::QuantizedActs;
use super::decode_x86::KDecode;
use super::gemm_avx512::{decode_legacy, kmeta, KMeta, OutTile, Panel, TaskSpec, MR};
use super::gemm_pack;
use super::layout::Legacy;

/// Activation rows per vector (and per packed group).
pub(crate) const LANES: usize = 8;
/// Activation groups (of 8 rows) per register tile, at most.
pub(crate) const NR: usize = 2;

/// Packed bytes per 32-element block and 8-row group (`gemm_pack`): 8 steps of 32 quant bytes,
/// then 8 lanes each of `-sum`, `d` and `s`.
const LEG_BLOCK: usize = gemm_pack::leg_block(LANES);
const LEG_NEG_SUM: usize = gemm_pack::leg_fields(LANES)[0];
const LEG_D: usize = gemm_pack::leg_fields(LANES)[1];
const LEG_S: usize = gemm_pack::leg_fields(LANES)[2];
/// Packed bytes per 256-element super-block and 8-row group: 64 steps of 32 quant bytes, 8
/// vectors of `bsums` pairs (two i16 per lane), then 8 lanes of `d`.
const K_BLOCK: usize = gemm_pack::k_block(LANES);
const K_BSUMS: usize = gemm_pack::k_fields(LANES)[0];
const K_D: usize = gemm_pack::k_fields(LANES)[1];

/// Bytes of one packed activation group of `k` columns.
pub(crate) fn group_bytes(kquant: bool, k: usize) -> usize {
    if kquant {
        (k / 256) * K_BLOCK
    } else {
        (k / 32) * LEG_BLOCK
    }
}

/// Packs group `g` of Q8 rows for this GEMM (`gemm_pack::pack_q8` at 8 lanes).
pub(crate) fn pack_group_q8(acts: &QuantizedActs, g: usize, dst: &mut [u8]) {
    gemm_pack::pack_q8(acts, g, dst, LANES)
}

/// Packs group `g` of Q8_K rows for this GEMM.
pub(crate) fn pack_group_q8k(acts: &QuantizedActs, g: usize, dst: &mut [u8]) {
    gemm_pack::pack_q8k(acts, g, dst, LANES)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_kquant<T: KDecode>(rows: &[&[u8]], k: usize, p: &mut Panel) {
    let nb = k / 256;
    p.q.resize(rows.len() * k);
    p.meta.resize(rows.len() * nb, KMeta::default());
    let q = p.q.as_mut_slice();
    for (r, w) in rows.iter().enumerate() {
        for (b, blk) in w.chunks_exact(T::BYTES).take(nb).enumerate() {
            // SAFETY: the features are this function's; the block is whole.
            let (kb, qv) = unsafe { (T::scales(blk), T::quants(blk)) };
            for (i, v) in qv.iter().enumerate() {
                let dst = &mut q[r * k + 256 * b + 32 * i..][..32];
                // SAFETY: 32 bytes in bounds.
                unsafe { _mm256_storeu_si256(dst.as_mut_ptr() as *mut __m256i, *v) };
            }
            p.meta[r * nb + b] = kmeta::<T>(&kb);
        }
    }
}

/// Writes a tile: `acc[r][n]` lane `l` is weight row `row0 + r`, activation row `act0 + 8n + l`.
///
/// # Safety
/// `dst.out` must be valid for `t * rows` floats and this tile's part not accessed elsewhere.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn store<const NRT: usize>(dst: &OutTile, acc: &[[__m256; NRT]; MR]) {
    const { assert!(MR == 4) };
    for n in 0..NRT {
        let m0 = dst.act0 + n * LANES;
        if dst.row0 + MR <= dst.rows && m0 + LANES <= dst.t {
            // Transpose 4 rows × 8 lanes so each activation row gets its 4 outputs as one 16-byte
            // store: after the unpacks, 128-bit half h of u[e] is activation 4h + e.
            let (v0, v1, v2, v3) = (acc[0][n], acc[1][n], acc[2][n], acc[3][n]);
            let (t0, t1) = (_mm256_unpacklo_ps(v0, v1), _mm256_unpackhi_ps(v0, v1));
            let (t2, t3) = (_mm256_unpacklo_ps(v2, v3), _mm256_unpackhi_ps(v2, v3));
            let lo =
                |a: __m256, b: __m256| _mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(a), _mm256_castps_pd(b)));
            let hi =
                |a: __m256, b: __m256| _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(a), _mm256_castps_pd(b)));
            let u = [lo(t0, t2), hi(t0, t2), lo(t1, t3), hi(t1, t3)];
            for (e, u) in u.iter().enumerate() {
                // SAFETY: rows row0..row0 + 4 and activations m0..m0 + 8 are in bounds.
                unsafe {
                    _mm_storeu_ps(dst.out.add((m0 + e) * dst.rows + dst.row0), _mm256_castps256_ps128(*u));
                    _mm_storeu_ps(
                        dst.out.add((m0 + 4 + e) * dst.rows + dst.row0),
                        _mm256_extractf128_ps::<1>(*u),
                    );
                }
            }
            continue;
        }
        // Edge tile: element by element, skipping padding.
        for (r, acc) in acc.iter().enumerate() {
            let j = dst.row0 + r;
            if j >= dst.rows {
                break;
            }
            let mut lanes = [0.0f32; LANES];
            // SAFETY: 8 floats.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc[n]) };
            for (l, &x) in lanes.iter().enumerate() {
                let m = m0 + l;
                if m < dst.t {
                    // SAFETY: in bounds per the function contract.
                    unsafe { *dst.out.add(m * dst.rows + j) = x };
                }
            }
        }
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bcast_u32(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 4 readable bytes.
    _mm256_set1_epi32(unsafe { (p as *const i32).read_unaligned() })
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 32 readable bytes.
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

/// Unsigned weight bytes (each below 64) times signed activation bytes, in fours to i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot4(w: __m256i, a: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1))
}

/// One `MR × (NRT·8)` legacy tile over all `nb` blocks. (Hot loops avoid closures and iterator
/// adapters: those would not inherit this function's target features.)
///
/// # Safety
/// Pointers must cover `nb` blocks: `q[r]` 32·nb bytes, `d[r]`/`m[r]` nb floats, `a[n]`
/// `nb · LEG_BLOCK` packed bytes.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_legacy<T: Legacy, const NRT: usize>(
    q: [*const u8; MR],
    d: [*const f32; MR],
    m: [*const f32; MR],
    a: [*const u8; NRT],
    nb: usize,
    dst: &OutTile,
) {
    let zero = _mm256_setzero_si256();
    let mut facc = [[_mm256_setzero_ps(); NRT]; MR];
    let mut ab = a;
    for b in 0..nb {
        // SAFETY (whole loop body): in bounds per the function contract.
        unsafe {
            let mut iacc = [[zero; NRT]; MR];
            if T::OFFSET != 0 {
                // Start from -OFFSET·Σa, so the sums come out as Σ (q - OFFSET)·a.
                for n in 0..NRT {
                    let neg = load(ab[n].add(LEG_NEG_SUM));
                    let init = _mm256_sll_epi32(neg, _mm_cvtsi32_si128(T::SHIFT as i32));
                    for acc in iacc.iter_mut() {
                        acc[n] = init;
                    }
                }
            }
            for s in 0..8 {
                let mut av = [zero; NRT];
                for n in 0..NRT {
                    av[n] = load(ab[n].add(32 * s));
                }
                for r in 0..MR {
                    let wb = bcast_u32(q[r].add(32 * b + 4 * s));
                    for n in 0..NRT {
                        iacc[r][n] = _mm256_add_epi32(iacc[r][n], dot4(wb, av[n]));
                    }
                }
            }
            for n in 0..NRT {
                let da = _mm256_loadu_ps(ab[n].add(LEG_D) as *const f32);
                for r in 0..MR {
                    let s = _mm256_mul_ps(_mm256_set1_ps(*d[r].add(b)), da);
                    facc[r][n] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(iacc[r][n]), facc[r][n]);
                }
                if T::HAS_MIN {
                    let sa = _mm256_loadu_ps(ab[n].add(LEG_S) as *const f32);
                    for r in 0..MR {
                        facc[r][n] = _mm256_fmadd_ps(_mm256_set1_ps(*m[r].add(b)), sa, facc[r][n]);
                    }
                }
                ab[n] = ab[n].add(LEG_BLOCK);
            }
        }
    }
    // SAFETY: per the function contract.
    unsafe { store(dst, &facc) };
}

/// One `MR × (NRT·8)` K-quant tile over all `nb` super-blocks. `SUB` is the sub-block length the
/// scales apply to (32 for Q4_K / Q5_K, whose 16-element scale pairs are equal; else 16).
///
/// # Safety
/// As for [`tile_legacy`], with `meta[r]` covering `nb` entries and `a[n]` `nb · K_BLOCK` bytes.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_kquant<T: KDecode, const SUB: usize, const NRT: usize>(
    q: [*const u8; MR],
    meta: [*const KMeta; MR],
    a: [*const u8; NRT],
    nb: usize,
    dst: &OutTile,
) {
    let zero = _mm256_setzero_si256();
    let mut facc = [[_mm256_setzero_ps(); NRT]; MR];
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
                        av[n] = load(ab[n].add(32 * step));
                    }
                    for r in 0..MR {
                        let wb = bcast_u32(q[r].add(256 * b + 4 * step));
                        for n in 0..NRT {
                            t[r][n] = _mm256_add_epi32(t[r][n], dot4(wb, av[n]));
                        }
                    }
                }
                for r in 0..MR {
                    let sc = _mm256_set1_epi32(mt[r].sc[j * SUB / 16]);
                    for n in 0..NRT {
                        sumi[r][n] = _mm256_add_epi32(sumi[r][n], _mm256_mullo_epi32(t[r][n], sc));
                    }
                }
            }
            let mut summ = [[zero; NRT]; MR];
            for p in 0..8 {
                for n in 0..NRT {
                    let bp = load(ab[n].add(K_BSUMS + 32 * p));
                    for r in 0..MR {
                        if T::OFFSET != 0 {
                            let c = _mm256_set1_epi32(mt[r].corr[p]);
                            sumi[r][n] = _mm256_add_epi32(sumi[r][n], _mm256_madd_epi16(bp, c));
                        }
                        if T::HAS_MIN {
                            let mm = _mm256_set1_epi32(mt[r].mins[p]);
                            summ[r][n] = _mm256_add_epi32(summ[r][n], _mm256_madd_epi16(bp, mm));
                        }
                    }
                }
            }
            for n in 0..NRT {
                let da = _mm256_loadu_ps(ab[n].add(K_D) as *const f32);
                for r in 0..MR {
                    let t1 = _mm256_mul_ps(_mm256_set1_ps(mt[r].d), da);
                    facc[r][n] = _mm256_fmadd_ps(t1, _mm256_cvtepi32_ps(sumi[r][n]), facc[r][n]);
                    if T::HAS_MIN {
                        let t2 = _mm256_mul_ps(_mm256_set1_ps(mt[r].dmin), da);
                        facc[r][n] = _mm256_fnmadd_ps(t2, _mm256_cvtepi32_ps(summ[r][n]), facc[r][n]);
                    }
                }
                ab[n] = ab[n].add(K_BLOCK);
            }
        }
    }
    // SAFETY: per the function contract.
    unsafe { store(dst, &facc) };
}

/// Runs one GEMM task for a legacy type.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `out` must be valid for `t · rows` floats and the task's
/// output tiles accessed by no one else.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn task_legacy<T: Legacy>(spec: &TaskSpec, panel: &mut Panel, out: OutTile) {
    // Byte quants would saturate `dot4`'s i16 pair sums; `dot::gemm` offers none at this level.
    assert!(!T::BYTE_QUANTS, "Q8_0 has no AVX2 GEMM");
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
#[target_feature(enable = "avx2,fma,f16c")]
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
