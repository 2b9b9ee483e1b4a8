//! Loading a model onto the GPU: every matrix uploaded once, an f16 copy made for the GEMM route
//! (unless deterministic; F16 weights serve as their own), and the decode kernel of each matrix shape
//! chosen by timing the candidates (`tune::tune_decode`, and `tune::tune_group` for matrices that
//! read one input); the integer route's weights are repacked here when it wins.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet, VecDeque};
use std::ops::Range;
use std::rc::Rc;

use cudarc::driver::{CudaSlice, CudaView};
use tandem_gguf::GgmlType;
use tandem_model::weights::{FeedForward, Matrix, Weights};
use tandem_model::Model;

use crate::cache::graphs::{GraphCache, MAX_BATCH_ROWS};
use crate::matmul::dqmma::DqmmaScratch;
use crate::matmul::indexed::ExpertTable;
use crate::matmul::int8::{self, int8_format};
use crate::matmul::kinds::DecodeKernel;
use crate::matmul::tune::{tune_decode, tune_group, tune_group_batches, GroupMember, Tuning};
use crate::matmul::weights::DeviceWeights;
use crate::matmul::weights::F16Weights;
use crate::matmul::weights::GpuMatrix;
use crate::matmul::weights::GpuMemory;
use crate::matmul::weights::WeightBytes;
use crate::model::experts::{MIXTURE_GRAPHS_OFF, OFFLOADED_GRAPHS_OFF};
use crate::model::{Buffers, CudaModel, Mode, PassState, ARENA_INTS};
use crate::offload::OffloadLoad;
use crate::options::{CudaOptions, LabOptions};
use crate::routes;
use crate::routes::RouteSettings;
use crate::runtime::checked::driver;
use crate::runtime::device::Gpu;
use crate::runtime::launch::{dequant_f16, type_suffix};
use crate::runtime::profile::{Diagnostics, OpProfile, PassClock, ProfilerWindow};
use crate::CudaError;

/// A matrix uploaded and timed, its layouts not yet settled: a group member keeps both the ggml and
/// the integer-route layout until its group's launch is decided.
struct Pending {
    suffix: &'static str,
    original: CudaSlice<u8>,
    /// `Some(None)`: `original` itself holds the integer-route layout (once `settle` moved it there).
    repacked: Option<Option<CudaSlice<u8>>>,
    f16: Option<F16Weights>,
    tuning: Tuning,
    /// The token embedding table (its ggml rows stay for the embedding kernel).
    embeds: bool,
    /// Those rows, once `settle` has put the integer-route layout in `original`.
    embed_rows: Option<CudaSlice<u8>>,
}

impl Pending {
    /// The weights the integer kernel reads, when this type has one.
    fn int8_layout(&self) -> Option<&CudaSlice<u8>> {
        self.repacked.as_ref().map(|r| r.as_ref().unwrap_or(&self.original))
    }

    /// Keeps only the layout the chosen kernel reads.
    fn settle(mut self) -> Self {
        match self.tuning.kernel {
            DecodeKernel::Int8 { .. } => {
                if let Some(Some(r)) = self.repacked.take() {
                    let rows = std::mem::replace(&mut self.original, r);
                    if self.embeds {
                        self.embed_rows = Some(rows);
                    }
                }
                self.repacked = Some(None);
            }
            DecodeKernel::Float(_) => self.repacked = None,
        }
        self
    }
}

/// The runs of a group that may share one integer launch: members of one weight type with an
/// integer kernel and one width, at least two of them (Q4_K_M's q and k share a launch while its
/// Q6_K v goes alone), in graph order.
fn int8_runs<'m>(group: &[&'m Matrix], int8_enabled: bool) -> Vec<Vec<&'m Matrix>> {
    let shapes: Vec<(GgmlType, usize)> = group.iter().map(|m| (m.ty, m.cols)).collect();
    run_indices(&shapes, int8_enabled)
        .into_iter()
        .map(|run| run.into_iter().map(|i| group[i]).collect())
        .collect()
}

/// `int8_runs` over (type, width) pairs: the indices of each run.
fn run_indices(shapes: &[(GgmlType, usize)], int8_enabled: bool) -> Vec<Vec<usize>> {
    let mut runs: Vec<Vec<usize>> = Vec::new();
    for (i, &(ty, cols)) in shapes.iter().enumerate() {
        if !int8_enabled || int8_format(ty).is_none() {
            continue;
        }
        match runs.iter_mut().find(|r| shapes[r[0]] == (ty, cols)) {
            Some(r) => r.push(i),
            None => runs.push(vec![i]),
        }
    }
    runs.retain(|r| r.len() >= 2 && r.len() <= 3);
    runs
}

impl CudaModel {
    /// Uploads `cpu`'s weights to GPU `ordinal`; `progress(done, total)` follows the bytes.
    ///
    /// A pipeline of steps, each below in this order: open the device, check the model has kernels,
    /// upload and time each matrix, tune the grouped launches, settle each matrix's layout, stack the
    /// groups' f16 operands, upload the norms, note their readers, then the pass's arena, the
    /// arrival counters, the diagnostics and the dqmma scratch, and wait for the device.
    pub fn load(
        cpu: Model,
        ordinal: usize,
        deterministic: bool,
        options: CudaOptions,
        mut progress: impl FnMut(usize, usize),
    ) -> Result<Self, CudaError> {
        let gpu = Gpu::new(ordinal, options)?;
        check_supported(&cpu)?;
        let w = &cpu.weights;
        let mut memory = GpuMemory::default();
        let int8_enabled = gpu.options.int8;
        let candidates = group_candidates(w, int8_enabled);
        let mut offload_load = match &cpu.config.moe {
            Some(moe) => OffloadLoad::plan(
                &gpu,
                w,
                moe.n_expert,
                &gpu.options.offload,
                dense_bytes(w, deterministic),
            )?,
            None => None,
        };
        let mut pending = upload_and_tune(
            &gpu,
            &cpu,
            &candidates,
            deterministic,
            &mut memory,
            offload_load.as_mut(),
            &mut progress,
        )?;
        tune_groups(&gpu, w, int8_enabled, deterministic, &mut pending)?;
        let mut matrices = settle(pending, &mut memory);
        let offload = offload_load
            .map(|o| o.finish(&gpu, w, gpu.options.offload, &mut matrices))
            .transpose()?;
        if let Some(o) = &offload {
            memory.experts_host = o.host.bytes();
            memory.expert_slots = o.slots.bytes();
        }
        stack_input_groups(&gpu, w, &mut matrices)?;
        let norms = upload_norms(&gpu, w, &mut memory)?;
        let expert_tables = expert_tables(&gpu, w, &matrices)?;
        let weights = DeviceWeights {
            matrices,
            norms,
            norm_readers: norm_readers(w),
            expert_tables,
            memory,
        };
        // The allocations in this order (the arena, the counters, the dqmma scratch), the skip
        // notice between the last two.
        let pass = pass_state(&gpu)?;
        let arrivals = gpu.alloc::<i32>(cpu.config.n_head)?;
        let diagnostics = diagnostics(&gpu.options.lab);
        let buffers = buffers(&gpu, arrivals, dqmma_rows(w))?;
        let routes = RouteSettings {
            deterministic,
            stacked_split_max_rows: gpu.options.lab.stacked_split_max_rows,
            fused_qkv_store: gpu.options.fused_qkv_store,
        };
        let mut graphs = graph_cache(&gpu.options, diagnostics.profile.is_none());
        if cpu.config.moe.is_some() {
            // Past the indexed route's rows, a batch stays on the device only where every layer's
            // experts take the sorted route; else its ids come back to the host.
            if !sorted_experts(w, &weights.expert_tables) {
                graphs.max_batch_rows = routes::INDEXED_EXPERTS_MAX_ROWS;
            }
            if offload.is_some() {
                graphs.blocked = Some(OFFLOADED_GRAPHS_OFF);
            } else if !indexed_experts(w, &weights.expert_tables) {
                graphs.blocked = Some(MIXTURE_GRAPHS_OFF);
            }
        }
        gpu.synchronize()?;
        let model = CudaModel {
            cpu,
            gpu,
            routes,
            weights,
            pass,
            graphs,
            buffers,
            diagnostics,
            offload,
        };
        model.settle_expert_decode(deterministic)?;
        Ok(model)
    }
}

/// The model's attention and matrices have CUDA kernels: a supported head size, and each matrix a
/// type with a kernel and a width of whole 32-element blocks (a mixture's experts each a matrix).
fn check_supported(cpu: &Model) -> Result<(), CudaError> {
    let hd = cpu.config.head_dim;
    if !routes::head_dim_supported(hd) {
        return Err(CudaError::UnsupportedHeadDim(hd));
    }
    for m in &cpu.weights.matrices() {
        if type_suffix(m.ty).is_none() || m.cols % 32 != 0 {
            return Err(CudaError::UnsupportedType {
                name: m.name.clone(),
                ty: m.ty,
            });
        }
    }
    Ok(())
}

/// A mixture's router and experts, which get no f16 copy for the GEMM route. The experts: a copy of
/// every one would double or triple the resident weights (about 60 GB more for a 30B-A3B), and an
/// expert's rows in a chunk are a few of them, which the kernels over the quantized weights take
/// anyway. The router: its f32 logits decide the routing, which rounding them to f16 operands would
/// move from the CPU's for near ties; without a copy it takes the matvec route.
fn mixture_matrices(w: &Weights) -> HashSet<&str> {
    let mut names = expert_matrices(w);
    for l in &w.layers {
        if let FeedForward::Experts(e) = &l.ffn {
            names.insert(e.router.name.as_str());
        }
    }
    names
}

/// Every expert matrix of every mixture layer (the routers aside).
fn expert_matrices(w: &Weights) -> HashSet<&str> {
    let mut names = HashSet::new();
    for l in &w.layers {
        if let FeedForward::Experts(e) = &l.ffn {
            for set in [&e.gate, &e.up, &e.down] {
                names.extend(set.experts.iter().map(|m| m.name.as_str()));
            }
        }
    }
    names
}

/// The address table of each expert tensor whose experts all take one integer kernel (they share a
/// shape, so the load-time timing gave them one unless a member was refused the integer route).
fn expert_tables(
    gpu: &Gpu,
    w: &Weights,
    matrices: &HashMap<String, GpuMatrix>,
) -> Result<HashMap<String, ExpertTable>, CudaError> {
    let mut tables = HashMap::new();
    for l in &w.layers {
        let FeedForward::Experts(e) = &l.ffn else { continue };
        for set in [&e.gate, &e.up, &e.down] {
            let members: Option<Vec<&GpuMatrix>> = set.experts.iter().map(|m| matrices.get(&m.name)).collect();
            let Some(members) = members.filter(|m| !m.is_empty()) else {
                continue;
            };
            let DecodeKernel::Int8 { fmt, variant } = members[0].decode else {
                continue;
            };
            if !members.iter().all(|g| g.decode == members[0].decode) || !variant.fits(&[set.rows], set.cols) {
                continue;
            }
            let Ok(weights) = members.iter().map(|g| g.quantized.own()).collect::<Result<Vec<_>, _>>() else {
                continue;
            };
            let table = ExpertTable::new(gpu, &weights, members[0].suffix, fmt, variant, set.rows, set.cols)?;
            tables.insert(set.name.clone(), table);
        }
    }
    Ok(tables)
}

/// Whether every mixture layer's three expert tensors have address tables: then its decode steps
/// route on the device alone and may be captured as graphs.
fn indexed_experts(w: &Weights, tables: &HashMap<String, ExpertTable>) -> bool {
    w.layers.iter().all(|l| match &l.ffn {
        FeedForward::Experts(e) => [&e.gate, &e.up, &e.down]
            .iter()
            .all(|set| tables.contains_key(&set.name)),
        _ => true,
    })
}

/// Whether every mixture layer's expert tensors take the grouped tensor-core kernels as well: then
/// batches of any size route on the device alone.
fn sorted_experts(w: &Weights, tables: &HashMap<String, ExpertTable>) -> bool {
    indexed_experts(w, tables)
        && w.layers.iter().all(|l| match &l.ffn {
            FeedForward::Experts(e) => [&e.gate, &e.up, &e.down]
                .iter()
                .all(|set| tables.get(&set.name).is_some_and(ExpertTable::groups_on_tensor_cores)),
            _ => true,
        })
}

/// Device bytes of the weights other than a mixture's experts: their quantized bytes, and their f16
/// copies outside deterministic mode (an estimate for `--gpu-expert-budget auto`).
fn dense_bytes(w: &Weights, deterministic: bool) -> u64 {
    let experts = expert_matrices(w);
    // The routers stay on the device but, like the experts, get no f16 copy.
    let no_copy = mixture_matrices(w);
    w.matrices()
        .iter()
        .filter(|m| !experts.contains(m.name.as_str()))
        .map(|m| {
            let copy = if deterministic || no_copy.contains(m.name.as_str()) {
                0
            } else {
                2 * m.rows * m.cols
            };
            (m.bytes_len() + copy) as u64
        })
        .sum()
}

/// The dequantizing batch kernel's K-split partials (`dqmma.rs`): room for a launch of up to three
/// matrices of the largest's rows (a few MB, whatever the model).
fn dqmma_rows(w: &Weights) -> usize {
    3 * w.matrices().iter().map(|m| m.rows).max().unwrap_or(0)
}

/// Matrices that may join a grouped integer launch: they keep their repacked layout until the
/// groups are decided.
fn group_candidates(w: &Weights, int8_enabled: bool) -> HashSet<&str> {
    w.input_groups()
        .into_iter()
        .flat_map(|g| int8_runs(&g, int8_enabled))
        .flatten()
        .map(|m| m.name.as_str())
        .collect()
}

/// Every matrix uploaded, its f16 copy made, its integer-route layout repacked where it may be read,
/// and its decode kernel timed once per shape; settled unless a group candidate.
fn upload_and_tune(
    gpu: &Gpu,
    cpu: &Model,
    group_candidates: &HashSet<&str>,
    deterministic: bool,
    memory: &mut GpuMemory,
    mut offload: Option<&mut OffloadLoad>,
    progress: &mut impl FnMut(usize, usize),
) -> Result<HashMap<String, Pending>, CudaError> {
    let w = &cpu.weights;
    let mats = w.matrices();
    let total: usize = mats.iter().map(|m| m.bytes(&cpu.file).len()).sum();
    let mut done = 0;
    let int8_enabled = gpu.options.int8;
    let mut pending: HashMap<String, Pending> = HashMap::new();
    let mut tuned: HashMap<(&str, usize, usize, bool, bool), Tuning> = HashMap::new();
    let mixture = mixture_matrices(w);
    let experts = expert_matrices(w);
    for m in mats {
        let bytes = m.bytes(&cpu.file);
        let suffix = type_suffix(m.ty).expect("checked above");
        let original = gpu.upload(bytes)?;
        memory.weights_quantized += bytes.len();
        // The embedding table only needs its f16 copy when it is also the output projection.
        let multiplies = m.name != w.token_embd.name || w.output.name == w.token_embd.name;
        let f16 = match (multiplies && !deterministic && !mixture.contains(m.name.as_str()), m.ty) {
            (false, _) => None,
            (true, GgmlType::F16) => Some(F16Weights::Original),
            (true, _) => {
                memory.weights_f16 += m.rows * m.cols * 2;
                Some(F16Weights::Copy(dequant_f16(gpu, suffix, &original, m.rows, m.cols)?))
            }
        };
        // The embedding kernels read the ggml layout: a table that is only an embedding never takes
        // the integer route; one that is also the output projection (Gemma) keeps its rows for the
        // embedding and gets a repacked copy for the head's matvec (one more copy of the table:
        // 1.2 GB for the 27B, where the head read its 2.8 GB f16 copy through cuBLAS every token).
        let embeds = m.name == w.token_embd.name;
        let int8_fmt = int8_format(m.ty).filter(|_| int8_enabled && multiplies);
        // The choice depends on whether the integer kernel was on offer.
        // A mixture's experts take the integer kernel wherever there is one: the indexed decode route
        // (device ids, CUDA graphs) reads only that, and a float kernel's edge at one row does not pay
        // for a host round trip per layer.
        let is_expert = experts.contains(m.name.as_str());
        let key = (suffix, m.rows, m.cols, int8_fmt.is_some(), is_expert);
        // The integer-route layout is made only where it may be read: to time this shape, because
        // its timing chose the integer kernel, or for a group's launch.
        let needs_int8_layout = int8_fmt.is_some()
            && match tuned.get(&key) {
                None => true,
                Some(t) => matches!(t.kernel, DecodeKernel::Int8 { .. }) || group_candidates.contains(m.name.as_str()),
            };
        let repacked = if needs_int8_layout {
            Some(int8::repack(gpu, m.ty, &original, m.rows, m.cols)?)
        } else {
            None
        };
        let tuning = match tuned.get(&key) {
            Some(&t) => t,
            None => {
                let int8 = int8_fmt.zip(repacked.as_ref().map(|r| r.as_ref().unwrap_or(&original)));
                let w16 = f16.as_ref().map(|f| f.view(original.as_view())).transpose()?;
                let t = tune_decode(
                    gpu,
                    suffix,
                    &original,
                    int8,
                    w16.as_ref(),
                    m.rows,
                    m.cols,
                    deterministic,
                    is_expert,
                )?;
                tuned.insert(key, t);
                t
            }
        };
        let p = Pending {
            suffix,
            original,
            repacked,
            f16,
            tuning,
            embeds,
            embed_rows: None,
        };
        // A non-resident expert: its settled bytes go to host memory and leave the device.
        if let Some(o) = offload.as_deref_mut() {
            if let Some(at) = o.placed(&m.name) {
                let p = p.settle();
                o.keep(gpu, at, suffix, p.tuning, &p.original)?;
                memory.weights_quantized -= bytes.len();
                done += bytes.len();
                progress(done, total);
                continue;
            }
        }
        let p = if group_candidates.contains(m.name.as_str()) {
            p
        } else {
            p.settle()
        };
        pending.insert(m.name.clone(), p);
        done += bytes.len();
        progress(done, total);
    }
    Ok(pending)
}

/// Groups of matrices reading one input: one integer launch for all of them where that was measured
/// faster than their own kernels (each group shape timed once), and the batch routes of their
/// shared kernel.
fn tune_groups(
    gpu: &Gpu,
    w: &Weights,
    int8_enabled: bool,
    deterministic: bool,
    pending: &mut HashMap<String, Pending>,
) -> Result<(), CudaError> {
    let mut grouped = HashMap::new();
    for group in w.input_groups() {
        for run in int8_runs(&group, int8_enabled) {
            if run.iter().any(|m| pending[&m.name].tuning.cublas) {
                continue;
            }
            let key: (Vec<usize>, usize, &str) = (
                run.iter().map(|m| m.rows).collect(),
                run[0].cols,
                pending[&run[0].name].suffix,
            );
            let (choice, batch) = match grouped.get(&key) {
                Some(&c) => c,
                None => {
                    let members = run
                        .iter()
                        .map(|m| {
                            let p = &pending[&m.name];
                            Ok(GroupMember {
                                rows: m.rows,
                                kernel: p.tuning.kernel,
                                original: &p.original,
                                int8: p.int8_layout(),
                                f16: p.f16.as_ref().map(|f| f.view(p.original.as_view())).transpose()?,
                            })
                        })
                        .collect::<Result<Vec<_>, CudaError>>()?;
                    let fmt = int8_format(run[0].ty).expect("runs are integer-capable");
                    let c = tune_group(gpu, key.2, fmt, &members, key.1, deterministic)?;
                    // The members' one kernel, chosen for the group or each member's own.
                    let shared = c.or_else(|| {
                        let k = members[0].kernel;
                        members.iter().all(|m| m.kernel == k).then_some(k)
                    });
                    let batch = match shared {
                        Some(DecodeKernel::Int8 { variant, .. }) if !deterministic => {
                            Some(tune_group_batches(gpu, key.2, fmt, variant, &members, key.1)?)
                        }
                        _ => None,
                    };
                    grouped.insert(key, (c, batch));
                    (c, batch)
                }
            };
            for m in &run {
                let tuning = &mut pending.get_mut(&m.name).expect("pending").tuning;
                if let Some(kernel) = choice {
                    tuning.kernel = kernel;
                }
                if let Some(batch) = batch {
                    tuning.batch = batch;
                }
            }
        }
    }
    Ok(())
}

/// Each matrix with only the layout its chosen kernel reads, as the model keeps it.
fn settle(pending: HashMap<String, Pending>, memory: &mut GpuMemory) -> HashMap<String, GpuMatrix> {
    let mut matrices = HashMap::new();
    for (name, p) in pending {
        let p = p.settle();
        if p.embed_rows.is_some() {
            memory.tied_output_int8 += p.original.len();
        }
        let quantized = WeightBytes::Own(p.repacked.flatten().unwrap_or(p.original));
        matrices.insert(
            name,
            GpuMatrix {
                suffix: p.suffix,
                quantized,
                f16: p.f16,
                decode: p.tuning.kernel,
                decode_cublas: p.tuning.cublas,
                batch: p.tuning.batch,
                embed_rows: p.embed_rows,
            },
        );
    }
    matrices
}

fn upload_norms(gpu: &Gpu, w: &Weights, memory: &mut GpuMemory) -> Result<HashMap<String, CudaSlice<f32>>, CudaError> {
    let mut norms = HashMap::new();
    for n in w.norms() {
        norms.insert(n.name.clone(), gpu.upload(&n.data)?);
        memory.norms += n.data.len() * 4;
    }
    Ok(norms)
}

/// Each pre-norm's readers: a layer's q, k and v, its gate and up (or router); the output head.
fn norm_readers(w: &Weights) -> HashMap<String, Vec<String>> {
    let mut norm_readers = HashMap::new();
    for l in &w.layers {
        let names = |ms: &[&Matrix]| ms.iter().map(|m| m.name.clone()).collect::<Vec<_>>();
        norm_readers.insert(l.attn_norm.name.clone(), names(&l.qkv()));
        norm_readers.insert(l.ffn_norm.name.clone(), names(&l.ffn_inputs()));
    }
    norm_readers.insert(w.output_norm.name.clone(), vec![w.output.name.clone()]);
    norm_readers
}

/// A pass's state before the first: direct launches, the parameter arena allocated, nothing staged.
fn pass_state(gpu: &Gpu) -> Result<PassState, CudaError> {
    let arena = gpu.alloc::<i32>(ARENA_INTS)?;
    Ok(PassState {
        uploads: RefCell::new(Vec::new()),
        plans: RefCell::new(Vec::new()),
        mode: Cell::new(Mode::Normal),
        arena,
        staging: RefCell::new(Vec::new()),
        token_slot: Cell::new(None),
    })
}

/// The lab switches' diagnostics; says so on stderr when kernels are left out.
fn diagnostics(lab: &LabOptions) -> Diagnostics {
    let skipped_kernels = lab.skip.clone();
    if !skipped_kernels.is_empty() {
        eprintln!("TANDEM_CUDA_SKIP: leaving out {skipped_kernels:?}; a timing experiment, the logits are wrong");
    }
    Diagnostics {
        profile: lab.profile.then(OpProfile::default),
        pass_clock: lab.pass_times.then(PassClock::default),
        profiler_window: lab.profile_replays.map(|(from, to)| ProfilerWindow::new(from, to)),
        skipped_kernels,
    }
}

/// Empty pools, the arrival counters, the dqmma scratch for `dqmma_rows` rows.
fn buffers(gpu: &Gpu, arrivals: CudaSlice<i32>, dqmma_rows: usize) -> Result<Buffers, CudaError> {
    let dqmma_scratch = RefCell::new(DqmmaScratch::new(gpu, dqmma_rows)?);
    Ok(Buffers {
        f32_pool: Rc::default(),
        u16_pool: Rc::default(),
        u8_pool: Rc::default(),
        i32_pool: Rc::default(),
        arrivals: RefCell::new(arrivals),
        retired_arrivals: RefCell::new(Vec::new()),
        dqmma_scratch,
        pinned_logits: Default::default(),
    })
}

/// No graphs yet; decode graphs on where switched on and not profiling (an event per op needs
/// direct launches).
fn graph_cache(options: &CudaOptions, not_profiling: bool) -> GraphCache {
    GraphCache {
        enabled: Cell::new(not_profiling && options.graphs),
        blocked: None,
        max_batch_rows: MAX_BATCH_ROWS,
        batch_enabled: Cell::new(options.batch_graphs),
        captured_out: RefCell::new(None),
        cache: RefCell::new(Vec::new()),
        ahead: RefCell::new(None),
        ahead_enabled: options.ahead,
        ahead_taken: Cell::new(0),
        batch_replays: Cell::new(0),
        warmed: RefCell::new(VecDeque::new()),
    }
}

/// Moves the f16 operands of each group of matrices reading one input (a layer's q, k and v; its
/// gate and up) into one allocation, in the group's order, so that one GEMM can make all their
/// products (`matmul.rs`, `ffn.rs`): the dequantized copies of a quantized file, or an F16 file's
/// weights themselves (their matvecs then read their part of the allocation). The same memory as
/// before (one group's worth more while it moves).
fn stack_input_groups(gpu: &Gpu, w: &Weights, matrices: &mut HashMap<String, GpuMatrix>) -> Result<(), CudaError> {
    for group in w.input_groups() {
        if group.iter().any(|m| m.cols != group[0].cols) {
            continue;
        }
        let members: Option<Vec<&GpuMatrix>> = group.iter().map(|m| matrices.get(&m.name)).collect();
        let Some(members) = members else { continue };
        if let Some(copies) = members
            .iter()
            .map(|g| match &g.f16 {
                Some(F16Weights::Copy(w16)) => Some(w16.as_view()),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
        {
            let (all, ranges) = concatenate(gpu, &group, &copies)?;
            let all = Rc::new(all);
            for (m, range) in group.iter().zip(ranges) {
                if let Some(g) = matrices.get_mut(&m.name) {
                    // The separate copy is freed here, once the stream has copied it.
                    g.f16 = Some(F16Weights::Stacked(Rc::clone(&all), range));
                }
            }
        } else if let Some(own) = members
            .iter()
            .map(|g| match (&g.f16, &g.quantized) {
                (Some(F16Weights::Original), WeightBytes::Own(bytes)) => Some(bytes.as_view()),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
        {
            let (all, ranges) = concatenate(gpu, &group, &own)?;
            let all = Rc::new(all);
            for (m, range) in group.iter().zip(ranges) {
                if let Some(g) = matrices.get_mut(&m.name) {
                    g.quantized = WeightBytes::Part(Rc::clone(&all), range);
                }
            }
        }
    }
    Ok(())
}

/// `parts` (one a member of `group`) copied one after another into a new allocation, and the range
/// each took there.
fn concatenate<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    gpu: &Gpu,
    group: &[&Matrix],
    parts: &[CudaView<'_, T>],
) -> Result<(CudaSlice<T>, Vec<Range<usize>>), CudaError> {
    let total = parts.iter().map(|c| c.len()).sum();
    let mut all = gpu.alloc_out::<T>(total)?;
    let mut ranges = Vec::with_capacity(parts.len());
    let mut at = 0;
    for (m, part) in group.iter().zip(parts) {
        let range = at..at + part.len();
        driver(
            &format!("cuMemcpyDtoD (stack {})", m.name),
            gpu.stream.memcpy_dtod(part, &mut all.slice_mut(range.clone())),
        )?;
        at = range.end;
        ranges.push(range);
    }
    Ok((all, ranges))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_join_members_of_one_integer_type_and_width() {
        use GgmlType::*;
        // Q4_K_M's attention: q and k Q4_K share a launch, v (Q6_K) goes alone.
        assert_eq!(
            run_indices(&[(Q4_K, 4096), (Q4_K, 4096), (Q6_K, 4096)], true),
            vec![vec![0, 1]]
        );
        // Q8_0: all three; gate and up.
        assert_eq!(run_indices(&[(Q8_0, 4096); 3], true), vec![vec![0, 1, 2]]);
        assert_eq!(run_indices(&[(Q4_K, 4096), (Q4_K, 4096)], true), vec![vec![0, 1]]);
        // Types without an integer kernel, other widths, or the route switched off: no run.
        assert!(run_indices(&[(F16, 4096); 3], true).is_empty());
        assert!(run_indices(&[(Q4_K, 4096), (Q4_K, 2048)], true).is_empty());
        assert!(run_indices(&[(Q4_K, 4096); 2], false).is_empty());
        // Members need not be adjacent.
        assert_eq!(
            run_indices(&[(Q4_K, 4096), (Q6_K, 4096), (Q4_K, 4096)], true),
            vec![vec![0, 2]]
        );
    }
}
