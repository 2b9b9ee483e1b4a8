//! The kernel timeline: `TANDEM_CUDA_TRACE=path` compiles every kernel with `TANDEM_TRACE` defined
//! (`common.cuh`: block (0, 0, 0) of each launch records the global clock before and after its
//! `WAIT_PRIOR_GRID()`, its kernel's name and its grid) and writes the records as a table to `path`
//! when the model is dropped. `scripts/trace_summary.py` turns a table into the cost of each kernel
//! inside a replayed decode graph: a launch's wait is released when the launch before it has
//! finished, so the gap between two consecutive releases is what the first of them cost there, which
//! the op profile (each op timed alone) cannot measure.
//!
//! A timing experiment: the recording adds one atomic before each wait and a few stores after it in
//! one warp of each launch; nothing else changes, the logits included.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use cudarc::driver::{CudaModule, CudaStream};

use crate::runtime::checked::driver;
use crate::CudaError;

/// Records in each module's ring (`TRACE_CAP` in common.cuh), and words per record.
const TRACE_CAP: usize = 1 << 17;
const WORDS: usize = 6;

/// One launch as its block (0, 0, 0) saw it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Record {
    /// Global clock (ns) before and after the wait.
    pub arrived: u64,
    pub released: u64,
    /// Device address of the kernel's `__func__`.
    pub kernel: u64,
    pub grid: [u32; 3],
    pub block: u32,
}

/// The records of one module's ring (`raw`: the launch counter, then the records), oldest first.
/// When more launches than the ring holds were recorded, only the last `TRACE_CAP` remain.
pub(crate) fn records(raw: &[u64]) -> Vec<Record> {
    let Some((&count, body)) = raw.split_first() else {
        return Vec::new();
    };
    let cap = body.len() / WORDS;
    if cap == 0 {
        return Vec::new();
    }
    let count = count as usize;
    let first = count.saturating_sub(cap);
    (first..count)
        .map(|n| {
            let e = &body[(n % cap) * WORDS..][..WORDS];
            Record {
                arrived: e[0],
                released: e[1],
                kernel: e[2],
                grid: [e[3] as u32, (e[3] >> 32) as u32, e[4] as u32],
                block: (e[4] >> 32) as u32,
            }
        })
        // Each record ends with its launch's number plus one: a record whose stores had not landed
        // (a launch still running) carries its slot's older number, or zero.
        .zip(first..count)
        .filter(|(_, n)| body[(n % cap) * WORDS + 5] == *n as u64 + 1)
        .map(|(r, _)| r)
        .collect()
}

/// The table: one line per launch, by release time.
pub(crate) fn table(mut recs: Vec<Record>, names: &HashMap<u64, String>) -> String {
    recs.sort_by_key(|r| (r.released, r.arrived));
    let mut out = String::from("arrived_ns\treleased_ns\tkernel\tgrid_x\tgrid_y\tgrid_z\tblock\n");
    for r in recs {
        let name = names.get(&r.kernel).map_or("?", String::as_str);
        let _ = writeln!(
            out,
            "{}\t{}\t{name}\t{}\t{}\t{}\t{}",
            r.arrived, r.released, r.grid[0], r.grid[1], r.grid[2], r.block
        );
    }
    out
}

/// A NUL-terminated name at a device address, read a byte at a time (the string may end its
/// module's memory, so no read runs past the terminator).
fn device_name(ptr: u64) -> String {
    let mut bytes = Vec::new();
    for i in 0..96u64 {
        let mut b = [0u8; 1];
        if unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut b, ptr + i) }.is_err() || b[0] == 0 {
            break;
        }
        bytes.push(b[0]);
    }
    if bytes.is_empty() {
        format!("kernel@{ptr:#x}")
    } else {
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// Reads every module's ring and writes the table to `path`; returns the number of launches.
pub(crate) fn dump(modules: &[Arc<CudaModule>], stream: &Arc<CudaStream>, path: &Path) -> Result<usize, CudaError> {
    driver("synchronize before reading the trace", stream.synchronize())?;
    let mut recs = Vec::new();
    for m in modules {
        let ring = driver("the trace ring (tandem_trace)", m.get_global("tandem_trace", stream))?;
        let bytes = driver("copying the trace ring", stream.clone_dtoh(&ring))?;
        if bytes.len() != (1 + WORDS * TRACE_CAP) * 8 {
            return Err(CudaError::Driver {
                what: "the trace ring".into(),
                err: format!("{} bytes, expected {}", bytes.len(), (1 + WORDS * TRACE_CAP) * 8),
            });
        }
        let raw: Vec<u64> = bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        recs.extend(records(&raw));
    }
    let mut names = HashMap::new();
    for r in &recs {
        names.entry(r.kernel).or_insert_with(|| device_name(r.kernel));
    }
    let n = recs.len();
    std::fs::write(path, table(recs, &names)).map_err(|e| CudaError::Driver {
        what: format!("writing the kernel trace to {}", path.display()),
        err: e.to_string(),
    })?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(cap: usize, launches: &[(u64, u64)]) -> Vec<u64> {
        let mut raw = vec![0u64; 1 + WORDS * cap];
        raw[0] = launches.len() as u64;
        for (n, &(t0, t1)) in launches.iter().enumerate() {
            let e = &mut raw[1 + (n % cap) * WORDS..][..WORDS];
            e.copy_from_slice(&[t0, t1, 0xabc, 7 | (2 << 32), 1 | (128 << 32), n as u64 + 1]);
        }
        raw
    }

    #[test]
    fn records_come_oldest_first_and_a_wrapped_ring_keeps_the_last() {
        let launches: Vec<(u64, u64)> = (0..5).map(|i| (10 * i, 10 * i + 3)).collect();
        let all = records(&ring(8, &launches));
        assert_eq!(all.len(), 5);
        assert_eq!(all[0].grid, [7, 2, 1]);
        assert_eq!(all[0].block, 128);
        let kept = records(&ring(3, &launches));
        assert_eq!(kept.iter().map(|r| r.arrived).collect::<Vec<_>>(), vec![20, 30, 40]);
    }

    #[test]
    fn a_record_still_being_written_is_left_out() {
        let mut raw = ring(4, &[(1, 2), (3, 4)]);
        raw[0] = 3; // a third launch took its number but has not stored its record
        assert_eq!(records(&raw).len(), 2);
        // The first launch of all, unwritten, leaves a slot of zeros.
        let mut first = ring(4, &[]);
        first[0] = 1;
        assert!(records(&first).is_empty());
        // A wrapped slot still holding the launch before it (number 1 of a ring of 4, not 5).
        let mut wrapped = ring(4, &[(1, 2), (3, 4), (5, 6), (7, 8)]);
        wrapped[0] = 5;
        assert_eq!(records(&wrapped).len(), 3);
        assert!(records(&[]).is_empty());
        // A ring too short for one record holds none, whatever its counter says.
        assert!(records(&[3, 1, 2]).is_empty());
    }

    #[test]
    fn the_table_orders_launches_by_release() {
        let recs = records(&ring(4, &[(5, 50), (1, 20)]));
        let names = HashMap::from([(0xabc, "attend_tiles".to_string())]);
        let t = table(recs, &names);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[1].starts_with("1\t20\tattend_tiles\t7\t2\t1\t128"));
        assert!(lines[2].starts_with("5\t50\t"));
    }
}
