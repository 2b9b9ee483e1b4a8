//! The page-locked host-to-device copy rate (`tandem-dev bench link`): what the expert stream's
//! 90% target is measured against. Copies `bytes` of page-locked host memory into a device buffer on
//! a stream of its own, once whole and then in pieces of the sizes an expert entry's matrices have,
//! issued back to back as the stream's issuer does; wall time from the first issue to the stream's
//! synchronize, the best of a few passes after a warm-up.

use std::time::Instant;

use cudarc::driver::{CudaStream, DevicePtr};

use crate::runtime::checked::driver;
use crate::runtime::device::Gpu;
use crate::CudaError;

/// One piece size's rate.
#[derive(Clone, Debug)]
pub struct LinkRate {
    pub piece_bytes: usize,
    pub pieces: usize,
    /// The best pass's rate (GB/s, 1e9 bytes).
    pub best_gbs: f64,
    /// The median pass's rate.
    pub median_gbs: f64,
}

/// Times `passes` passes over `bytes` for each of `piece_sizes` (a piece of 0 bytes or of `bytes`
/// or more: one copy of the whole buffer).
pub fn bench_link(gpu: &Gpu, bytes: usize, piece_sizes: &[usize], passes: usize) -> Result<Vec<LinkRate>, CudaError> {
    let copy = driver("cuStreamCreate (link)", gpu.ctx.new_stream())?;
    // SAFETY: page-locked bytes written below before any copy reads them.
    let mut host = driver("cuMemHostAlloc (link)", unsafe { gpu.ctx.alloc_pinned::<u8>(bytes) })?;
    for (i, b) in driver("page-locked host memory", host.as_mut_slice())?
        .iter_mut()
        .enumerate()
    {
        *b = (i as u32).wrapping_mul(2_654_435_761) as u8;
    }
    let device = gpu.alloc::<u8>(bytes)?;
    let src = driver("page-locked host memory", host.as_slice())?;
    let (dst, _record) = device.device_ptr(&gpu.stream);
    driver("cuStreamSynchronize (link)", gpu.stream.synchronize())?;
    let mut out = Vec::new();
    for &piece in piece_sizes {
        let piece = if piece == 0 { bytes } else { piece.min(bytes) };
        let pieces = bytes / piece;
        let mut rates = Vec::with_capacity(passes);
        for pass in 0..=passes {
            let start = Instant::now();
            copy_pieces(&copy, src, dst, piece, pieces)?;
            driver("cuStreamSynchronize (link)", copy.synchronize())?;
            let seconds = start.elapsed().as_secs_f64();
            if pass > 0 {
                rates.push((piece * pieces) as f64 / seconds / 1e9);
            }
        }
        rates.sort_by(f64::total_cmp);
        out.push(LinkRate {
            piece_bytes: piece,
            pieces,
            best_gbs: rates.last().copied().unwrap_or(0.0),
            median_gbs: rates.get(rates.len() / 2).copied().unwrap_or(0.0),
        });
    }
    Ok(out)
}

fn copy_pieces(copy: &CudaStream, src: &[u8], dst: u64, piece: usize, pieces: usize) -> Result<(), CudaError> {
    for i in 0..pieces {
        let from = &src[i * piece..(i + 1) * piece];
        // SAFETY: `from` lies in the page-locked buffer, which outlives the synchronize that follows;
        // `dst + i·piece` lies in the device buffer of the same length.
        driver("cuMemcpyHtoDAsync (link)", unsafe {
            cudarc::driver::result::memcpy_htod_async(dst + (i * piece) as u64, from, copy.cu_stream())
        })?;
    }
    Ok(())
}
