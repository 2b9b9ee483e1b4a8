//! Every `TANDEM_CUDA_*` switch, read once (`CudaOptions::from_env`) and handed to the device
//! (`Gpu::new`) and the model (`CudaModel::load`), which keep them for the kernels and passes that
//! ask. `CudaOptions` holds the switches a user may turn: each turns off one route or mechanism for
//! another that gives correct logits. `LabOptions` holds the developer-only knobs, which exist to
//! time, trace or break a pass; none belongs in a user's environment.

use std::path::PathBuf;

use tandem_model::expert_stream::{ExpertStreamMode, StreamDepth};

use crate::routes;
use crate::CudaError;

/// The switches of the CUDA backend; `Default` is an empty environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaOptions {
    /// Decode steps through captured CUDA graphs (`TANDEM_CUDA_GRAPHS=0` turns this off).
    pub graphs: bool,
    /// Batched decode steps through them too (`TANDEM_CUDA_BATCH_GRAPHS=0` turns only this off).
    pub batch_graphs: bool,
    /// The next decode step's dry pass made while the GPU runs this one (`TANDEM_CUDA_AHEAD=0`).
    pub ahead: bool,
    /// Programmatic edges between a decode graph's kernels on sm_90+ (`TANDEM_CUDA_PDL=0`).
    pub pdl: bool,
    /// The integer decode route, int8 activations and `dp4a` matvecs (`TANDEM_CUDA_INT8=0`).
    pub int8: bool,
    /// Decode batches on the tensor cores over the quantized weights (`TANDEM_CUDA_QMMA=0`: the
    /// batched matvec and cuBLAS instead).
    pub qmma: bool,
    /// Decode batches on the dequantizing tensor-core kernel (`TANDEM_CUDA_DQMMA=0`: cuBLAS instead).
    pub dqmma: bool,
    /// The staged batch kernels for batches of 2-8 rows (`TANDEM_CUDA_STAGED_BATCH=0`: the unstaged
    /// batched kernels instead).
    pub staged_batch: bool,
    /// Prefill chunks on the stacked q/k/v GEMM cut, rotate and store its product in one launch
    /// (`TANDEM_CUDA_FUSED_QKV_STORE=0`: the split and the store as launches of their own).
    pub fused_qkv_store: bool,
    /// Where a mixture's experts live and how prefill streams the ones in host memory (set from the
    /// command line: `--gpu-expert-budget`, `--expert-stream`, `--expert-stream-depth`, `--trace`).
    pub offload: ExpertOffload,
    /// Developer-only knobs.
    pub lab: LabOptions,
}

/// How much of a mixture's experts the GPU holds (`--gpu-expert-budget`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExpertBudget {
    /// Every expert resident (the default).
    #[default]
    All,
    /// At most this many bytes of experts resident; the rest in page-locked host memory.
    Bytes(u64),
    /// What the device's free memory holds after the dense weights, a reserve for the KV caches,
    /// activations and the streaming slots kept back (`offload::auto_budget`).
    Auto,
}

impl std::str::FromStr for ExpertBudget {
    type Err = String;

    /// `all`, `auto`, or bytes with an optional K, M, G or T suffix (powers of 1024; `KiB`, `GB` and
    /// the like read the same).
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim().to_ascii_lowercase();
        match t.as_str() {
            "all" => return Ok(ExpertBudget::All),
            "auto" => return Ok(ExpertBudget::Auto),
            _ => {}
        }
        let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (number, unit) = t.split_at(digits);
        let shift = match unit.trim().trim_end_matches("ib").trim_end_matches('b') {
            "" => 0,
            "k" => 10,
            "m" => 20,
            "g" => 30,
            "t" => 40,
            _ => return Err(format!("{s:?}: expected all, auto or a size such as 0, 512M or 20G")),
        };
        let n: u64 = number
            .parse()
            .map_err(|_| format!("{s:?}: expected all, auto or a size such as 0, 512M or 20G"))?;
        n.checked_mul(1u64 << shift)
            .map(ExpertBudget::Bytes)
            .ok_or_else(|| format!("{s:?} is too large"))
    }
}

/// Where decode steps (and batches of up to `routes::INDEXED_EXPERTS_MAX_ROWS` rows) compute a
/// routed expert that is in host memory (`--expert-decode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExpertDecode {
    /// An expert already in a device slot runs there; one that is not runs where the first decode
    /// steps, alternating, measured the faster steps: copied into a slot and computed on the GPU, or
    /// computed on the CPU from the model file while the GPU runs the others (`model::cpu_experts`).
    /// Deterministic mode keeps every expert on the GPU (the CPU's sums are other bits).
    #[default]
    Auto,
    /// Always through the slots (the GPU computes every expert).
    Gpu,
    /// Every non-resident expert on the CPU, as llama.cpp's `--n-cpu-moe` does.
    Cpu,
}

impl std::str::FromStr for ExpertDecode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(ExpertDecode::Auto),
            "gpu" => Ok(ExpertDecode::Gpu),
            "cpu" => Ok(ExpertDecode::Cpu),
            _ => Err(format!("{s:?}: expected auto, gpu or cpu")),
        }
    }
}

/// The expert placement and streaming options of a CUDA model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpertOffload {
    pub budget: ExpertBudget,
    /// Where decode steps compute routed experts in host memory (`--expert-decode`).
    pub decode: ExpertDecode,
    /// The walk of prefill chunks of `STREAM_MIN_ROWS` rows or more (`--expert-stream`).
    pub stream: ExpertStreamMode,
    /// Copies queued ahead of the link (`--expert-stream-depth`).
    pub depth: StreamDepth,
    /// Each streamed chunk's copied and skipped entries and link rate on stderr (`--trace`).
    pub trace: bool,
}

/// Developer-only knobs: they time, trace or override a choice to measure it, and some give wrong
/// logits (`skip`). Nothing a user runs should set them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabOptions {
    /// Kernels left out of every pass (`TANDEM_CUDA_SKIP=add_norm_to,gated_quant,...`, names from
    /// `SKIPPABLE_KERNELS`): measures what those launches cost inside a decode step's graph. The
    /// logits are wrong while it is set.
    pub skip: Vec<String>,
    /// GPU time per op, printed when the model is dropped (`TANDEM_CUDA_PROFILE=1`; turns decode
    /// graphs off).
    pub profile: bool,
    /// Enqueue, GPU and wall time per pass on stderr (`TANDEM_CUDA_PASS_TIMES=1`).
    pub pass_times: bool,
    /// The decode-graph replays a profiler collects, FROM to TO, numbered from 1
    /// (`TANDEM_CUDA_PROFILE_REPLAYS=FROM-TO`).
    pub profile_replays: Option<(u64, u64)>,
    /// Where the kernel timeline goes (`TANDEM_CUDA_TRACE=path`; the kernels record it only then).
    pub trace: Option<PathBuf>,
    /// Load-time timing reads a buffer larger than L2 before each launch (`TANDEM_CUDA_TUNE_FLUSH=0`
    /// times back to back).
    pub tune_flush: bool,
    /// Integer variants the load-time timing may pick, by label (`TANDEM_CUDA_MMVQ=u2r1s1p,...`),
    /// where one of them fits a shape.
    pub mmvq: Option<String>,
    /// Query heads a decode attention block takes, where the kernel has that form
    /// (`TANDEM_CUDA_DECODE_HEADS`).
    pub decode_heads: Option<usize>,
    /// Blocks a head of decode attention, capped at the tiles (`TANDEM_CUDA_DECODE_SPLITS`).
    pub decode_splits: Option<usize>,
    /// Tiles from which a prefill chunk's attention takes a block per KV head
    /// (`TANDEM_CUDA_GROUP_TILES`; 1: always, a large number: never).
    pub group_tiles: Option<usize>,
    /// Rows up to which q, k and v take one stacked GEMM and a split
    /// (`TANDEM_CUDA_STACKED_SPLIT_MAX_ROWS`; 0 turns it off).
    pub stacked_split_max_rows: usize,
    /// Each mixture routing made on the device checked against the host's on the same logits
    /// (`TANDEM_CUDA_CHECK_ROUTING=1`): a pass fails where they differ.
    pub check_routing: bool,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            graphs: true,
            batch_graphs: true,
            ahead: true,
            pdl: true,
            int8: true,
            qmma: true,
            dqmma: true,
            staged_batch: true,
            fused_qkv_store: true,
            offload: ExpertOffload::default(),
            lab: LabOptions::default(),
        }
    }
}

impl Default for LabOptions {
    fn default() -> Self {
        LabOptions {
            skip: Vec::new(),
            profile: false,
            pass_times: false,
            profile_replays: None,
            trace: None,
            tune_flush: true,
            mmvq: None,
            decode_heads: None,
            decode_splits: None,
            group_tiles: None,
            stacked_split_max_rows: routes::STACKED_SPLIT_MAX_ROWS,
            check_routing: false,
        }
    }
}

/// A switch that is on unless its variable is `0`.
fn on_unless_zero(var: &str) -> bool {
    std::env::var(var).map_or(true, |v| v != "0")
}

/// A switch that is on only when its variable is `1`.
fn on_if_one(var: &str) -> bool {
    std::env::var(var).as_deref() == Ok("1")
}

/// A number, or `None` when the variable is unset or not a number.
fn number(var: &str) -> Option<usize> {
    std::env::var(var).ok().and_then(|v| v.parse().ok())
}

impl CudaOptions {
    /// Every switch from the environment; an error names a variable whose value cannot be read.
    pub fn from_env() -> Result<Self, CudaError> {
        Ok(CudaOptions {
            graphs: on_unless_zero("TANDEM_CUDA_GRAPHS"),
            batch_graphs: on_unless_zero("TANDEM_CUDA_BATCH_GRAPHS"),
            ahead: on_unless_zero("TANDEM_CUDA_AHEAD"),
            pdl: on_unless_zero("TANDEM_CUDA_PDL"),
            int8: on_unless_zero("TANDEM_CUDA_INT8"),
            qmma: on_unless_zero("TANDEM_CUDA_QMMA"),
            dqmma: on_unless_zero("TANDEM_CUDA_DQMMA"),
            staged_batch: on_unless_zero("TANDEM_CUDA_STAGED_BATCH"),
            fused_qkv_store: on_unless_zero("TANDEM_CUDA_FUSED_QKV_STORE"),
            offload: ExpertOffload::default(),
            lab: LabOptions::from_env()?,
        })
    }
}

impl LabOptions {
    /// The developer knobs from the environment.
    pub fn from_env() -> Result<Self, CudaError> {
        const REPLAYS: &str = "TANDEM_CUDA_PROFILE_REPLAYS";
        let profile_replays = match std::env::var(REPLAYS) {
            Err(_) => None,
            Ok(spec) => Some(replay_window(&spec).ok_or_else(|| CudaError::Driver {
                what: REPLAYS.into(),
                err: format!("{spec:?}: expected FROM-TO, replay numbers from 1 with FROM <= TO"),
            })?),
        };
        let stacked_split_max_rows = match std::env::var("TANDEM_CUDA_STACKED_SPLIT_MAX_ROWS") {
            Ok(v) => v.parse().map_err(|_| CudaError::Driver {
                what: "TANDEM_CUDA_STACKED_SPLIT_MAX_ROWS".into(),
                err: format!("{v:?} is not a row count"),
            })?,
            Err(_) => routes::STACKED_SPLIT_MAX_ROWS,
        };
        Ok(LabOptions {
            skip: skipped_kernels(std::env::var("TANDEM_CUDA_SKIP").ok().as_deref())?,
            profile: on_if_one("TANDEM_CUDA_PROFILE"),
            pass_times: on_if_one("TANDEM_CUDA_PASS_TIMES"),
            profile_replays,
            trace: std::env::var_os("TANDEM_CUDA_TRACE")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            tune_flush: on_unless_zero("TANDEM_CUDA_TUNE_FLUSH"),
            mmvq: std::env::var("TANDEM_CUDA_MMVQ").ok(),
            decode_heads: number("TANDEM_CUDA_DECODE_HEADS"),
            decode_splits: number("TANDEM_CUDA_DECODE_SPLITS"),
            group_tiles: number("TANDEM_CUDA_GROUP_TILES"),
            stacked_split_max_rows,
            check_routing: on_if_one("TANDEM_CUDA_CHECK_ROUTING"),
        })
    }
}

/// `FROM-TO`, replay numbers from 1 with FROM <= TO.
fn replay_window(spec: &str) -> Option<(u64, u64)> {
    let (a, b) = spec.trim().split_once('-')?;
    let (from, to) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
    (1 <= from && from <= to).then_some((from, to))
}

/// The kernels `TANDEM_CUDA_SKIP` may leave out: the row kernels between a decode step's matvecs.
pub const SKIPPABLE_KERNELS: [&str; 4] = ["add_norm_to", "gated_quant", "rope_kv_store", "attend_tiles"];

/// `TANDEM_CUDA_SKIP`'s comma-separated list, each name one of `SKIPPABLE_KERNELS`.
fn skipped_kernels(list: Option<&str>) -> Result<Vec<String>, CudaError> {
    let names: Vec<String> = list
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(str::to_string)
        .collect();
    match names.iter().find(|k| !SKIPPABLE_KERNELS.contains(&k.as_str())) {
        Some(unknown) => Err(CudaError::Driver {
            what: "TANDEM_CUDA_SKIP".into(),
            err: format!("no kernel {unknown:?} to leave out (one of {SKIPPABLE_KERNELS:?})"),
        }),
        None => Ok(names),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expert_budgets_parse_sizes_and_words() {
        let b = |s: &str| s.parse::<ExpertBudget>();
        assert_eq!(b("all"), Ok(ExpertBudget::All));
        assert_eq!(b(" Auto "), Ok(ExpertBudget::Auto));
        assert_eq!(b("0"), Ok(ExpertBudget::Bytes(0)));
        assert_eq!(b("4096"), Ok(ExpertBudget::Bytes(4096)));
        assert_eq!(b("512M"), Ok(ExpertBudget::Bytes(512 << 20)));
        assert_eq!(b("20G"), Ok(ExpertBudget::Bytes(20 << 30)));
        assert_eq!(b("20GiB"), Ok(ExpertBudget::Bytes(20 << 30)));
        assert_eq!(b("3gb"), Ok(ExpertBudget::Bytes(3 << 30)));
        assert_eq!(b("1T"), Ok(ExpertBudget::Bytes(1 << 40)));
        for bad in ["", "G", "-1", "1.5G", "12X", "99999999999T", "lots"] {
            assert!(b(bad).is_err(), "{bad:?}");
        }
        assert_eq!(ExpertOffload::default().budget, ExpertBudget::All);
        assert_eq!(ExpertOffload::default().stream, ExpertStreamMode::Routed);
        assert_eq!(ExpertOffload::default().depth.get(), 16);
        assert_eq!(ExpertOffload::default().decode, ExpertDecode::Auto);
        for (text, want) in [
            ("auto", ExpertDecode::Auto),
            (" GPU", ExpertDecode::Gpu),
            ("cpu", ExpertDecode::Cpu),
        ] {
            assert_eq!(text.parse(), Ok(want));
        }
        assert!("ncmoe".parse::<ExpertDecode>().is_err());
    }

    #[test]
    fn skipped_kernels_are_known_names() {
        assert!(skipped_kernels(None).unwrap().is_empty());
        assert_eq!(
            skipped_kernels(Some("add_norm_to, attend_tiles,")).unwrap(),
            vec!["add_norm_to".to_string(), "attend_tiles".to_string()]
        );
        let err = skipped_kernels(Some("add_norm")).unwrap_err().to_string();
        assert!(err.contains("add_norm") && err.contains("attend_tiles"), "{err}");
    }

    #[test]
    fn a_profiler_window_is_two_replay_numbers_from_one() {
        assert_eq!(replay_window("20-22"), Some((20, 22)));
        assert_eq!(replay_window(" 5 - 5 "), Some((5, 5)));
        for bad in ["", "7", "0-3", "9-3", "a-b", "3-", "-3", "1-2-3"] {
            assert_eq!(replay_window(bad), None, "{bad:?}");
        }
    }
}
