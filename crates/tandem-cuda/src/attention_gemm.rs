//! Prefill attention on the tensor cores, for chunks longer than `MATVEC_MAX_ROWS` outside
//! deterministic mode (`routes::attention_route`): the scores of the whole chunk against every key it
//! may see come from one cuBLAS batched GEMM per query head of a KV group (f16 Q and K, f32 scores),
//! a masked softmax rounds the probabilities to f16, and a second batched GEMM multiplies them by V.
//! Each key and value row is read once per chunk, where the tile kernel reads it once per query.
//!
//! It needs the chunk's keys contiguous in the buffer: always so for global layers, staged buffers
//! and rings that have not wrapped inside the range; otherwise the tile kernel takes the chunk.

use std::ffi::c_void;
use std::ops::Range;

use cudarc::cublas::{result::gemm_strided_batched_ex, sys as blas};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, PushKernelArg};
use tandem_model::backend::AttendRows;

use crate::device::driver;
use crate::launch::{i32_of, launch_cfg, to_f16_into};
use crate::model::{CudaModel, GpuAct};
use crate::CudaError;

/// The keys a chunk reads: logical positions `lo .. lo + n`, at physical rows `phys .. phys + n`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyRange {
    pub lo: usize,
    pub n: usize,
    pub phys: usize,
}

/// The keys queries at `positions` may see in a buffer of `capacity` rows holding positions from
/// `origin_logical` at physical row `origin_physical`, or `None` when they wrap around its end.
pub fn key_range(
    positions: &[usize],
    window: Option<usize>,
    (capacity, origin_logical, origin_physical): (usize, usize, usize),
) -> Option<KeyRange> {
    let lo = positions
        .iter()
        .map(|&p| window.map_or(0, |w| (p + 1).saturating_sub(w)).max(origin_logical))
        .min()?;
    let n = (positions.iter().max()? + 1).checked_sub(lo)?;
    let phys = (origin_physical + lo - origin_logical) % capacity;
    (phys + n <= capacity).then_some(KeyRange { lo, n, phys })
}

/// One strided-batched GEMM, f16 operands: `C = op(A) · B` over `batch` items, column-major.
struct Batched {
    trans_a: bool,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: (u64, usize, usize),
    b: (u64, usize, usize),
    c: (u64, usize, usize, blas::cudaDataType_t),
    batch: usize,
}

impl CudaModel {
    fn batched_gemm(&self, g: Batched) -> Result<(), CudaError> {
        let beta = 0f32;
        let op = |t| {
            if t {
                blas::cublasOperation_t::CUBLAS_OP_T
            } else {
                blas::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let stride = |s: usize| s as i64;
        unsafe {
            gemm_strided_batched_ex(
                *self.gpu.blas.handle(),
                op(g.trans_a),
                op(false),
                i32_of(g.m, "m")?,
                i32_of(g.n, "n")?,
                i32_of(g.k, "k")?,
                &g.alpha as *const f32 as *const c_void,
                g.a.0 as *const c_void,
                blas::cudaDataType_t::CUDA_R_16F,
                i32_of(g.a.1, "lda")?,
                stride(g.a.2),
                g.b.0 as *const c_void,
                blas::cudaDataType_t::CUDA_R_16F,
                i32_of(g.b.1, "ldb")?,
                stride(g.b.2),
                &beta as *const f32 as *const c_void,
                g.c.0 as *mut c_void,
                g.c.3,
                i32_of(g.c.1, "ldc")?,
                stride(g.c.2),
                i32_of(g.batch, "batch")?,
                blas::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| CudaError::Blas {
            what: format!("attention GEMM {}x{}x{} by {}", g.m, g.n, g.k, g.batch),
            err: format!("{e:?}"),
        })
    }

    /// Attention of `rows` of `io` over keys `keys` of `kc`/`vc` by the GEMM route.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attend_gemm(
        &self,
        io: &mut AttendRows<'_, GpuAct>,
        rows: &Range<usize>,
        kc: &CudaSlice<u16>,
        vc: &CudaSlice<u16>,
        keys: KeyRange,
        positions: &[usize],
        window: Option<usize>,
    ) -> Result<(), CudaError> {
        let c = &self.cpu.config;
        let (t, nk, hd) = (rows.len(), keys.n, c.head_dim);
        let (qw, kvw) = (c.q_width(), c.kv_width());
        let group = c.n_head / c.n_kv_head;
        let gpu = &self.gpu;
        let mut q16 = gpu.alloc_out::<u16>(t * qw)?;
        to_f16_into(
            gpu,
            &io.q.buf()?.slice(rows.start * qw..rows.end * qw),
            &mut q16,
            t * qw,
        )?;
        let mut scores = gpu.alloc_out::<f32>(c.n_head * t * nk)?;
        let mut probs = gpu.alloc_out::<u16>(c.n_head * t * nk)?;
        let stream = &gpu.stream;
        let key_off = (keys.phys * kvw * 2) as u64;
        {
            let (k_ptr, _gk) = kc.device_ptr(stream);
            let (q_ptr, _gq) = q16.device_ptr(stream);
            let (s_ptr, _gs) = scores.device_ptr_mut(stream);
            // Head h = g * group + hh reads KV head g; one batched call per hh, batched over g.
            for hh in 0..group {
                self.batched_gemm(Batched {
                    trans_a: true,
                    m: nk,
                    n: t,
                    k: hd,
                    alpha: c.attn_scale,
                    a: (k_ptr + key_off, kvw, hd),
                    b: (q_ptr + (hh * hd * 2) as u64, qw, group * hd),
                    c: (
                        s_ptr + (hh * t * nk * 4) as u64,
                        nk,
                        group * t * nk,
                        blas::cudaDataType_t::CUDA_R_32F,
                    ),
                    batch: c.n_kv_head,
                })?;
            }
        }
        {
            // The same list for every layer of the chunk: uploaded once (`param` remembers it).
            let pos = self.param(positions, "position")?;
            let pos = self.view(&pos);
            let (ti, nki, lo, win) = (
                i32_of(t, "t")?,
                i32_of(nk, "keys")?,
                i32_of(keys.lo, "key position")?,
                i32_of(window.unwrap_or(0), "window")?,
            );
            let f = gpu.function("attend_softmax")?;
            let mut b = gpu.stream.launch_builder(f);
            b.arg(&scores)
                .arg(&mut probs)
                .arg(&pos)
                .arg(&ti)
                .arg(&nki)
                .arg(&lo)
                .arg(&win);
            driver("attend_softmax", unsafe {
                b.launch(launch_cfg((t as u32, c.n_head as u32, 1), 256))
            })?;
        }
        let (v_ptr, _gv) = vc.device_ptr(stream);
        let (p_ptr, _gp) = probs.device_ptr(stream);
        let (o_ptr, _go) = io.out.buf_mut()?.device_ptr_mut(stream);
        let o_base = o_ptr + (rows.start * qw * 4) as u64;
        for hh in 0..group {
            self.batched_gemm(Batched {
                trans_a: false,
                m: hd,
                n: t,
                k: nk,
                alpha: 1.0,
                a: (v_ptr + key_off, kvw, hd),
                b: (p_ptr + (hh * t * nk * 2) as u64, nk, group * t * nk),
                c: (
                    o_base + (hh * hd * 4) as u64,
                    qw,
                    group * hd,
                    blas::cudaDataType_t::CUDA_R_32F,
                ),
                batch: c.n_kv_head,
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_global_cache_gives_every_key_from_the_start() {
        let positions: Vec<usize> = (512..1024).collect();
        let k = key_range(&positions, None, (4096, 0, 0)).unwrap();
        assert_eq!(
            k,
            KeyRange {
                lo: 0,
                n: 1024,
                phys: 0
            }
        );
    }

    #[test]
    fn a_window_starts_at_the_first_query_window() {
        // Window 512, queries 600..700: the first query sees 89..=600.
        let positions: Vec<usize> = (600..700).collect();
        let k = key_range(&positions, Some(512), (8192, 0, 0)).unwrap();
        assert_eq!(
            k,
            KeyRange {
                lo: 89,
                n: 611,
                phys: 89
            }
        );
    }

    #[test]
    fn keys_that_wrap_around_a_ring_are_refused() {
        // A ring of 8 holding 12..20 from physical 4; queries 18, 19 with window 8 need 11..=19,
        // clamped to 12..=19: physical 4..8 then 0..4, which wraps.
        assert_eq!(key_range(&[18, 19], Some(8), (8, 12, 4)), None);
        // A staging buffer (origin physical 0) is contiguous.
        assert_eq!(
            key_range(&[18, 19], Some(8), (10, 12, 0)),
            Some(KeyRange { lo: 12, n: 8, phys: 0 })
        );
    }
}
