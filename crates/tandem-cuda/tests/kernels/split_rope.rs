//! `split_rope_kv_store` (a prefill chunk's stacked q|k|v product cut, rotated and stored in one
//! launch) against the unfused route it replaces: `split_columns`, `rope` on q and K, `kv_store`.

use anyhow::Result;
use tandem_cuda::lab::attention::tile::{
    kv_store_into, split_rope_kv_store_into, RopeStoreShape, SplitRopeStoreBuffers,
};
use tandem_cuda::lab::launch::split_columns_into;
use tandem_cuda::lab::ops::rows::rope_into;
use tandem_cuda::Gpu;
use tandem_model::config::{RopeParams, RopeStyle};

use crate::common::{Rng, Row};

#[test]
fn split_rope_store_equals_the_unfused_route() {
    crate::common::run("split + rope + store checks", split_rope_store_checks);
}

/// Cache rows in each check; the chunk's rows land on a scattered subset, some rows skipped.
const CACHE_ROWS: usize = 64;

/// Bit for bit: q (poisoned with NaN first) and the cache (the same random contents on both sides,
/// so rows the chunk does not own must come through untouched), for the 8B's heads (interleaved
/// pairs), Gemma's 256-wide heads (NeoX pairs), and a partial rotation (NeoX, half the head).
pub(crate) fn split_rope_store_checks(gpu: &Gpu, rng: &mut Rng, table: &mut Vec<Row>) -> Result<()> {
    let cases = [
        (32usize, 8usize, 128usize, 128usize, RopeStyle::Interleaved, 500_000f32),
        (4, 1, 256, 256, RopeStyle::Neox, 1_000_000.0),
        (6, 2, 128, 64, RopeStyle::Neox, 10_000.0),
    ];
    let t = 37usize;
    for (nq, nkv, hd, n_rot, style, freq_base) in cases {
        let rope = RopeParams {
            style,
            n_rot,
            freq_base,
            freq_scale: 1.0,
        };
        let (qw, kvw) = (nq * hd, nkv * hd);
        let stacked: Vec<f32> = (0..t * (qw + 2 * kvw)).map(|_| rng.normal()).collect();
        let cache: Vec<u16> = (0..2 * CACHE_ROWS * kvw)
            .map(|_| half::f16::from_f32(rng.normal()).to_bits())
            .collect();
        let first = (rng.next() % 4000) as i32;
        let pos: Vec<i32> = (0..t as i32).map(|r| first + r).collect();
        // Every fifth row not stored; the others on distinct cache rows, out of order.
        let dst: Vec<i32> = (0..t)
            .map(|r| {
                if r % 5 == 4 {
                    -1
                } else {
                    ((r * 7 + 3) % CACHE_ROWS) as i32
                }
            })
            .collect();
        let (stacked_d, pos_d, dst_d) = (gpu.upload(&stacked)?, gpu.upload(&pos)?, gpu.upload(&dst)?);
        let (kc0, vc0) = cache.split_at(CACHE_ROWS * kvw);

        // The unfused route.
        let mut q = gpu.upload(&vec![f32::NAN; t * qw])?;
        let mut k = gpu.upload(&vec![f32::NAN; t * kvw])?;
        let mut v = gpu.upload(&vec![f32::NAN; t * kvw])?;
        split_columns_into(gpu, &stacked_d, t, &mut [(&mut q, qw), (&mut k, kvw), (&mut v, kvw)])?;
        rope_into(gpu, &mut q, Some(&mut k), &pos_d.as_view(), (t, qw, kvw, hd), &rope)?;
        let (mut kc, mut vc) = (gpu.upload(kc0)?, gpu.upload(vc0)?);
        kv_store_into(
            gpu,
            (&k.as_view(), &v.as_view()),
            (&mut kc, &mut vc),
            &dst_d.as_view(),
            t,
            kvw,
        )?;

        // The fused kernel.
        let mut q2 = gpu.upload(&vec![f32::NAN; t * qw])?;
        let (mut kc2, mut vc2) = (gpu.upload(kc0)?, gpu.upload(vc0)?);
        let shape = RopeStoreShape {
            rows: t,
            n_head: nq,
            n_kv_head: nkv,
            head_dim: hd,
            rope,
        };
        let bufs = SplitRopeStoreBuffers {
            qkv: stacked_d.as_view(),
            q: q2.as_view_mut(),
            kc: kc2.as_view_mut(),
            vc: vc2.as_view_mut(),
            dst: dst_d.as_view(),
            pos: pos_d.as_view(),
        };
        split_rope_kv_store_into(gpu, &shape, bufs)?;

        let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<u32>>();
        let (want_q, got_q) = (gpu.download(&q)?, gpu.download(&q2)?);
        let q_equal = bits(&want_q) == bits(&got_q) && got_q.iter().all(|x| x.is_finite());
        let k_equal = gpu.download(&kc)? == gpu.download(&kc2)?;
        let v_equal = gpu.download(&vc)? == gpu.download(&vc2)?;
        // The route does rotate: q differs from its unrotated part wherever the angle is not zero.
        let rotated = (0..t * qw).any(|i| want_q[i] != stacked[(i / qw) * (qw + 2 * kvw) + i % qw]);
        table.push(Row {
            check: format!(
                "split + rope + kv_store in one launch, {nq}/{nkv} heads of {hd}, n_rot {n_rot} {style:?}, \
                 t={t}, positions from {first}"
            ),
            result: format!(
                "q bit-equal to split_columns then rope: {q_equal} (rotated: {rotated}); K and V cache bit-equal \
                 to rope then kv_store (rows not stored untouched): {k_equal}, {v_equal}"
            ),
            pass: q_equal && k_equal && v_equal && rotated,
        });
    }
    Ok(())
}
