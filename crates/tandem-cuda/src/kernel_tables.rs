//! The host's kernel tables against the kernel sources: every name a route, a variant or a launcher
//! asks for is one the compiled modules define (GPU-free; a test only).

use crate::attention::flash::{chosen, Products, VARIANTS};
use crate::matmul::int8::{variants, STAGED_BATCH_SIZES};
use crate::routes;
use crate::runtime::device::kernel_names;
use crate::runtime::nvrtc;

#[test]
fn kernel_names_are_found_in_every_file() {
    let ops = kernel_names(nvrtc::OPS.body);
    for k in [
        "rms_norm",
        "add_norm_to",
        "gated_quant",
        "gpu_hold",
        "rope",
        "gated",
        "to_f16",
        "gather_rows",
        "moe_route",
        "moe_combine",
        "moe_sort",
        "kv_store",
        "kv_gather",
        "split_rope_kv_store",
    ] {
        assert!(ops.contains(&k.to_string()), "{k} in {ops:?}");
    }
    let att = kernel_names(nvrtc::ATTENTION.body);
    // One tile kernel per head size the route admits.
    let sizes: Vec<usize> = (5..=8).map(|b| 1 << b).collect();
    assert!(sizes.iter().all(|&d| routes::head_dim_supported(d)));
    let mut want: Vec<String> = sizes
        .iter()
        .flat_map(|d| {
            [
                format!("attend_tiles_d{d}"),
                format!("attend_rope_d{d}"),
                format!("attend_rope_rows_d{d}"),
            ]
        })
        .collect();
    // The fused decode kernel over two heads of a group, for the sizes that have it.
    for d in [64, 128] {
        assert!(routes::decode_attention_heads_fit(16, 8, d, 2));
        want.push(format!("attend_rope_h2_d{d}"));
        want.push(format!("attend_rope_rows_h2_d{d}"));
    }
    assert_eq!(att, want);
    // The host's table of flash variants is the list of entry points, in order.
    let flash = kernel_names(nvrtc::FLASH.body);
    let table: Vec<String> = VARIANTS.iter().map(|v| v.kernel()).collect();
    assert_eq!(flash, table);
    for major in [8, 9] {
        for d in [32, 64, 128, 256] {
            for t in [9, 512, 4096] {
                let v = chosen(d, t, major).unwrap();
                assert_eq!(v.head_dim, d);
                assert!(v.runs_on(major));
            }
        }
    }
    assert_eq!(chosen(128, 4096, 8).map(|v| v.m_tiles), Some(2));
    assert_eq!(chosen(128, 512, 8).map(|v| v.m_tiles), Some(1));
    assert_eq!(
        chosen(128, 512, 9).map(|v| (v.products, v.m_tiles, v.key_tile)),
        Some((Products::Warpgroup, 2, 128))
    );
    assert_eq!(
        chosen(128, 64, 9).map(|v| (v.products, v.m_tiles, v.key_tile)),
        Some((Products::Warpgroup, 1, 64))
    );
    assert_eq!(chosen(256, 512, 9).map(|v| v.products), Some(Products::QInRegisters));
    assert_eq!(chosen(96, 512, 9), None);
    let quant = kernel_names(nvrtc::QUANT.body);
    assert!(quant.contains(&"matvec_q4_k".to_string()));
    assert!(quant.contains(&"dequant_f16_q6_k".to_string()));
    assert!(quant.contains(&"embed_q8_0".to_string()));
    assert!(quant.contains(&"matvec2b_f16".to_string()));
    assert!(quant.contains(&"matvec2_bf16".to_string()));
    assert_eq!(quant.len(), 80);
    let mmvq = kernel_names(nvrtc::MMVQ.body);
    for k in [
        "quantize_q8k",
        "quantize_q8",
        "repack_scales_out",
        "mmvq_q4_k_u1_r1_s1",
        "mmvqb_q4_k_u2_r2_s1",
        "mmvq_q6_k_u2_r1_s4",
        "mmvqb_q8_0_u8_r1_s1",
    ] {
        assert!(mmvq.contains(&k.to_string()), "{k} in {mmvq:?}");
    }
    // Every variant the tuning may pick has its kernels, and no kernel is left unoffered.
    let mut offered = std::collections::HashSet::new();
    for suffix in ["q4_k", "q6_k", "q8_0"] {
        for v in variants(suffix) {
            for batched in [false, true] {
                assert!(mmvq.contains(&v.kernel(suffix, batched)), "{suffix} {v:?}");
                offered.insert(v.kernel(suffix, batched));
            }
            assert!(mmvq.contains(&v.ids_kernel(suffix)), "{suffix} {v:?}");
            offered.insert(v.ids_kernel(suffix));
            if suffix != "q8_0" && v.split == 1 {
                for nb in STAGED_BATCH_SIZES {
                    offered.insert(v.staged_batch_kernel(suffix, nb));
                }
            }
        }
    }
    // Besides the variants: the quantizers and the repacks.
    for k in ["repack_q4_k_regions", "repack_q6_k_regions", "mmvqp_q6_k_u2_r1_s1"] {
        assert!(mmvq.contains(&k.to_string()), "{k} in {mmvq:?}");
    }
    assert_eq!(mmvq.len(), 5 + offered.len());
    // The tensor-core kernels of prefill chunks, one per type `int8::mmq_takes` admits, then their
    // grouped forms for a mixture's sorted pairs (`ExpertTable::groups_on_tensor_cores`).
    assert_eq!(
        kernel_names(nvrtc::MMQ.body),
        [
            "mmq_q4_k",
            "mmq_q6_k",
            "mmq_q8_0",
            "mmq_ids_q4_k",
            "mmq_ids_q6_k",
            "mmq_ids_q8_0"
        ]
    );
}
