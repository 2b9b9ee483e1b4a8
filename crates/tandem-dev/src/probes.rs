//! The GPU probes (`tandem_cuda::lab::handover`, `latency` and `link`) run at the sizes that
//! matter to a decode step.

use anyhow::Result;
use tandem_cuda::lab::handover::bench_handover;
use tandem_cuda::lab::latency::{bench_latency, Latency};
use tandem_cuda::lab::link::bench_link;
use tandem_cuda::Gpu;

use crate::common::Row;

/// `tandem_cuda::lab::handover` at a grid of one block an SM and at the grid sizes of a decode step's
/// matvecs (four and five blocks an SM).
pub fn handover_bench(gpu: &Gpu, table: &mut Vec<Row>) -> Result<()> {
    let steps = 256;
    for per_sm in [1, 4, 5] {
        let h = bench_handover(gpu, per_sm * gpu.sm_count, steps)?;
        let resident = h
            .resident_us
            .map_or_else(|| "not resident at once".to_string(), |us| format!("{us:.2} us"));
        table.push(Row {
            what: format!("hand-over a step, {} blocks of 128 threads, {steps} steps", h.blocks),
            result: format!(
                "programmatic edges {:.2} us; plain edges {:.2} us; resident grid, barrier {resident}",
                h.programmatic_us, h.plain_us
            ),
        });
    }
    Ok(())
}

/// `tandem_cuda::lab::latency`: a cycle that stays in L2 and one that misses it, alone and beside a
/// stream over 4 GB of weights (from memory), then beside one over 24 MB (from L2: whether the
/// slower round trips come from the memory's queues or from the L2 and its network).
pub fn latency_bench(gpu: &Gpu, table: &mut Vec<Row>) -> Result<()> {
    let sizes = [(64 << 10, 20_000), (4 << 20, 20_000), (256 << 20, 5_000)];
    for (stream_bytes, from) in [(4usize << 30, "4 GB weight stream"), (24 << 20, "24 MB stream from L2")] {
        for l in bench_latency(gpu, &sizes, stream_bytes)? {
            table.push(latency_row(&l, from));
        }
    }
    Ok(())
}

fn latency_row(l: &Latency, from: &str) -> Row {
    Row {
        what: format!("round trip beside a {from}, {} KB cycle", l.cycle_bytes >> 10),
        result: format!(
            "{:.0} ns alone, {:.0} ns beside the stream ({:.2}x); stream {:.2} TB/s alone, {:.2} beside the chase; the stream ran through {:.0}% of the chase",
            l.alone_ns,
            l.loaded_ns,
            l.loaded_ns / l.alone_ns,
            l.stream_tbs,
            l.stream_loaded_tbs,
            100.0 * l.overlap
        ),
    }
}

/// `tandem_cuda::lab::link`: the page-locked host-to-device rate over 2 GiB, whole and in the piece
/// sizes an expert stream issues (one matrix of a Qwen3-30B-A3B expert at Q4_K is 864 KiB, its down
/// matrix at Q6_K 1,260 KiB), the rate the stream's 90% target is read against.
pub fn link_bench(gpu: &Gpu, table: &mut Vec<Row>) -> Result<()> {
    let pieces = [0, 64 << 20, 4 << 20, 1_290_240, 884_736, 256 << 10];
    for r in bench_link(gpu, 2 << 30, &pieces, 5)? {
        table.push(Row {
            what: format!(
                "host to device, page-locked, {} pieces of {} KiB",
                r.pieces,
                r.piece_bytes >> 10
            ),
            result: format!("best {:.1} GB/s, median {:.1} GB/s", r.best_gbs, r.median_gbs),
        });
    }
    Ok(())
}
