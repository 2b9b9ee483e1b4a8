//! The developer surface, below the backend's API: what the kernel tests (`tests/kernels`) and
//! `tandem-dev`'s benchmarks reach. Each kernel family's launchers with their shape and buffer types,
//! re-exported here under the path of the module that owns them (`lab::attention::tile` is
//! `attention::tile`), and the route helpers a test needs to lay out a launch as the model does; and
//! the probes (`handover`, `latency`, `link`), which time the GPU itself rather than a kernel of the model.
//! Nothing a user runs goes through here, and these items change with the kernels.

pub mod handover;
pub mod latency;
pub mod link;

/// The float launchers and cuBLAS GEMMs (`runtime::launch`).
pub mod launch {
    pub use crate::runtime::launch::{
        dequant_f16, gemm_f16_into, gemm_f16_out, gemm_into, matvec_into, split_columns_into, to_f16_into, type_suffix,
    };
}

/// Matrix products: the integer decode route and the tensor-core decode batches (`matmul`).
pub mod matmul {
    pub mod kinds {
        pub use crate::matmul::kinds::{ActQuant, MatvecFamily, MmvqVariant};
    }

    pub mod indexed {
        pub use crate::matmul::indexed::{mmq_ids_into, mmvq_ids_into, ExpertTable, Pairs};
    }

    pub mod int8 {
        pub use crate::matmul::int8::{
            int8_format, mmq_takes, mmvq_group_into, mmvq_group_into_with, mmvq_into, quantize_act_into, repack,
            repacked_source, staged_batch, variants, MmvqKernels, MmvqTarget,
        };
    }

    pub mod qmma {
        pub use crate::matmul::qmma::{has_kernel, kernel, qmma_group_into, MAX_ROWS};
    }

    pub mod dqmma {
        pub use crate::matmul::dqmma::{dqmma_group_into, grid, kernel, DqmmaScratch, Grid};
    }

    pub mod tune {
        pub use crate::matmul::tune::time_cold_and_hot;
    }
}

/// The attention kernels (`attention`).
pub mod attention {
    pub mod flash {
        pub use crate::attention::flash::{
            chosen, flash_attention_into, key_range, plan, FlashShape, FlashVariant, KeyRange, VARIANTS,
        };
    }

    pub mod rows {
        pub use crate::attention::rows::{
            buffer_table, decode_rows_attention_into, table_addresses, DecodeRowsBuffers, ROW_INTS,
        };
    }

    pub mod tile {
        pub use crate::attention::tile::{
            kv_store_into, rope_kv_store_into, split_rope_kv_store_into, tile_attention_into, FreshRow, KvCache,
            RopeStoreBuffers, RopeStoreShape, SplitRopeStoreBuffers, TileBuffers, TileShape,
        };
    }
}

/// Row kernels between the products (`ops`).
pub mod ops {
    pub mod ffn {
        pub use crate::ops::ffn::gated_pair_into;
    }

    pub mod moe {
        pub use crate::ops::moe::{
            combine_into, max_sort_tiles, route_into, sort_into, RouteShape, SortedPairs, SORT_TILE,
        };
    }

    pub mod rows {
        pub use crate::ops::rows::{add_norm_rows_into, add_norm_to_into, quant_flag, rms_norm_into, rope_into};
    }
}

/// Which tiles a decode step's attention reads, and how its heads merge (`routes`).
pub mod routes {
    pub use crate::routes::{attention_merge, first_key, tile_span, TileSpan};
}
