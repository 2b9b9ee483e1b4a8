//! `tandem gpu-check`: the CUDA backend against the CPU backend on the same weights.
//!
//! 1. Kernels: for every weight type the GPU reads, a fresh random matrix (quantized on the CPU) and
//!    fresh random activations; the matvec and GEMM routes against an f64 reference over the same
//!    dequantized weights, outputs poisoned with NaN first so an unwritten element fails; the matvec
//!    must also give every row the same bits alone and batched. The integer route (`int8.rs`) must
//!    also quantize activations to the CPU backend's bits. The prefill attention kernel (`flash.rs`)
//!    and the decode attention kernel (`tiles.rs`) against an f64 softmax. The GEMM route's norm and
//!    gating kernels (`rows.rs`) against f64.
//! 2. Models: a prompt prefilled and then greedy decoding on both backends; tokens must agree up to the
//!    first step whose CPU top-2 margin is below 0.1; the largest relative logit error is reported.
//! 3. Deterministic mode (the model loaded again as `--deterministic` loads it): `logits_sha256` of
//!    teacher-forced scoring must match across chunk sizes.

mod batch_graphs;
mod decode_rows;
mod dqmma;
mod flash;
mod gemm;
mod int8;
mod qmma;
mod rows;
mod split_rope;
mod tiles;

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::Args;
use tandem_cuda::matmul::kinds::MatvecFamily;
use tandem_cuda::runtime::launch::{dequant_f16, gemm_into, matvec_into, type_suffix};
use tandem_cuda::{CudaOptions, Gpu};
use tandem_engine::score::ScoreOptions;
use tandem_engine::{sampling, Engine};
use tandem_gguf::GgmlType;
use tandem_model::{LogitRows, Model};

#[derive(Args)]
pub struct GpuCheckArgs {
    /// GGUF files to compare end to end (kernel checks run regardless).
    #[arg(long = "model", short = 'm')]
    pub models: Vec<String>,
    /// Prompt length for the model comparison.
    #[arg(long, default_value_t = 1500)]
    pub prompt: usize,
    /// Rows per prefill chunk of the greedy comparison (both backends).
    #[arg(long, default_value_t = 512)]
    pub prefill_chunk: usize,
    /// Greedy steps after the prompt.
    #[arg(long, default_value_t = 64)]
    pub gen: usize,
    /// Chunk sizes whose deterministic-mode logits must hash the same.
    #[arg(long, value_delimiter = ',', default_value = "1,64,512")]
    pub chunks: Vec<usize>,
    /// Prompt length for the deterministic hashes (chunk size 1 decodes every position).
    #[arg(long, default_value_t = 1500)]
    pub hash_prompt: usize,
    /// CPU threads for the oracle.
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    #[arg(long, default_value_t = 0)]
    pub gpu: usize,
    /// Leave the kernel checks out (only the models are checked).
    #[arg(long)]
    pub no_kernel_checks: bool,
    /// The kernel checks' random seed, to run again the inputs of a failed check (each run prints
    /// its seed; a fresh one when not given).
    #[arg(long)]
    pub seed: Option<u64>,
}

/// A small xorshift generator: fresh seeds each run (printed), reproducible given the seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Roughly normal: the sum of four uniforms, centred and scaled.
    fn normal(&mut self) -> f32 {
        let u: f32 = (0..4).map(|_| (self.next() >> 40) as f32 / (1u64 << 24) as f32).sum();
        (u - 2.0) * 1.7
    }
}

fn rel_err(out: &[f32], reference: &[f64]) -> f64 {
    let mut num = 0f64;
    let mut den = 0f64;
    for (&o, &r) in out.iter().zip(reference) {
        if !o.is_finite() {
            return f64::INFINITY;
        }
        num += (o as f64 - r).powi(2);
        den += r * r;
    }
    (num / den.max(1e-300)).sqrt()
}

struct Row {
    check: String,
    result: String,
    pass: bool,
}

pub fn gpu_check(args: &GpuCheckArgs) -> Result<()> {
    let mut table: Vec<Row> = Vec::new();
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let gpu = Gpu::new(args.gpu, CudaOptions::from_env()?)?;
    if !args.no_kernel_checks {
        kernel_checks(&gpu, args.seed, &mut table)?;
    }
    for m in &args.models {
        model_checks(args, m, threads, &mut table)?;
    }
    println!("\n| check | result | pass |");
    println!("|---|---|---|");
    for r in &table {
        println!("| {} | {} | {} |", r.check, r.result, if r.pass { "yes" } else { "NO" });
    }
    if table.iter().any(|r| !r.pass) {
        bail!(
            "{} of {} GPU checks failed",
            table.iter().filter(|r| !r.pass).count(),
            table.len()
        );
    }
    Ok(())
}

fn kernel_checks(gpu: &Gpu, seed: Option<u64>, table: &mut Vec<Row>) -> Result<()> {
    let seed = match seed {
        Some(s) => s,
        None => SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos() as u64,
    } | 1;
    eprintln!(
        "gpu: {} ({}); kernel check seed {seed} (--seed {seed} runs these inputs again)",
        gpu.name, gpu.arch
    );
    let mut rng = Rng(seed);
    let types = [
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::F32,
    ];
    let (rows, cols) = (300, 2560);
    for ty in types {
        let suffix = type_suffix(ty).expect("checked types have kernels");
        let row_bytes = ty.row_bytes(cols as u64).context("row size")? as usize;
        let mut w = vec![0u8; rows * row_bytes];
        for r in 0..rows {
            let src: Vec<f32> = (0..cols).map(|_| rng.normal() * 0.05).collect();
            tandem_quant::quantize_row(ty, &src, &mut w[r * row_bytes..(r + 1) * row_bytes])?;
        }
        let deq = tandem_quant::dequantize(ty, &w)?;
        int8::int8_checks(gpu, &mut rng, ty, &w, &deq, (rows, cols), table)?;
        let w_dev = gpu.upload(&w)?;
        let w16 = dequant_f16(gpu, suffix, &w_dev, rows, cols)?;
        // F16 weights are their own GEMM operand in the model (no copy): that view is what is checked,
        // and it must hold the bits the dequantizing copy would.
        // SAFETY: an F16 matrix's bytes are rows * cols f16 values in one device allocation.
        let w16_view = match ty {
            GgmlType::F16 => unsafe { w_dev.transmute::<u16>(rows * cols) }.context("f16 view of F16 weights")?,
            _ => w16.as_view(),
        };
        if ty == GgmlType::F16 {
            let same = gpu
                .download(&w16)?
                .iter()
                .zip(w.chunks_exact(2))
                .all(|(h, b)| h.to_le_bytes() == b[..]);
            table.push(Row {
                check: "F16 weights serve as their own f16 GEMM operand".into(),
                result: format!("dequantized copy bit-equal to the original: {same}"),
                pass: same,
            });
        }
        let families = [
            MatvecFamily::Segmented,
            MatvecFamily::WarpPerRow,
            MatvecFamily::Lanewise,
        ];
        let mut worst_mv = [0f64; 3];
        let mut worst_gemm = 0f64;
        let mut batch_bits_equal = [true; 3];
        for t in [1usize, 5, 64] {
            let x: Vec<f32> = (0..t * cols).map(|_| rng.normal()).collect();
            let mut reference = vec![0f64; t * rows];
            for i in 0..t {
                for r in 0..rows {
                    reference[i * rows + r] = (0..cols)
                        .map(|c| deq[r * cols + c] as f64 * x[i * cols + c] as f64)
                        .sum();
                }
            }
            let x_dev = gpu.upload(&x)?;
            for (f, family) in families.into_iter().enumerate() {
                let mut out = gpu.upload(&vec![f32::NAN; t * rows])?;
                matvec_into(gpu, family, suffix, &w_dev.as_view(), &x_dev, t, rows, cols, &mut out)?;
                let mv = gpu.download(&out)?;
                worst_mv[f] = worst_mv[f].max(rel_err(&mv, &reference));
                // Batch invariance: each row of a batched matvec equals that row computed alone.
                if t == 5 {
                    for i in 0..t {
                        let xi = gpu.upload(&x[i * cols..(i + 1) * cols])?;
                        let mut oi = gpu.upload(&vec![f32::NAN; rows])?;
                        matvec_into(gpu, family, suffix, &w_dev.as_view(), &xi, 1, rows, cols, &mut oi)?;
                        let alone = gpu.download(&oi)?;
                        let batched = &mv[i * rows..(i + 1) * rows];
                        batch_bits_equal[f] &= alone.iter().zip(batched).all(|(a, b)| a.to_bits() == b.to_bits());
                    }
                }
            }
            let mut out = gpu.upload(&vec![f32::NAN; t * rows])?;
            let mut x16 = gpu.alloc::<u16>(t * cols)?;
            gemm_into(gpu, &w16_view, &x_dev, &mut x16, t, rows, cols, &mut out)?;
            worst_gemm = worst_gemm.max(rel_err(&gpu.download(&out)?, &reference));
        }
        // f32 accumulation over exactly dequantized weights; the GEMM route rounds both operands to f16.
        let (mv_bound, gemm_bound) = (1e-5, 5e-3);
        for (f, family) in families.into_iter().enumerate() {
            table.push(Row {
                check: format!("matvec {family:?} {ty} {rows}x{cols}, t=1,5,64"),
                result: format!(
                    "rel err {:.2e} (bound {mv_bound:.0e}); batched rows bit-equal: {}",
                    worst_mv[f], batch_bits_equal[f]
                ),
                pass: worst_mv[f] < mv_bound && batch_bits_equal[f],
            });
        }
        table.push(Row {
            check: format!("gemm (cuBLAS f16) {ty}"),
            result: format!("rel err {worst_gemm:.2e} (bound {gemm_bound:.0e})"),
            pass: worst_gemm < gemm_bound,
        });
    }
    flash::flash_checks(gpu, &mut rng, table)?;
    tiles::tile_checks(gpu, &mut rng, table)?;
    decode_rows::decode_rows_checks(gpu, &mut rng, table)?;
    rows::row_checks(gpu, &mut rng, table)?;
    gemm::pair_checks(gpu, &mut rng, table)?;
    gemm::stacked_split_checks(gpu, &mut rng, table)?;
    split_rope::split_rope_store_checks(gpu, &mut rng, table)?;
    int8::mmq_checks(gpu, &mut rng, table)?;
    qmma::qmma_checks(gpu, &mut rng, table)?;
    dqmma::dqmma_checks(gpu, &mut rng, table)?;
    Ok(())
}

/// `n` device copies of a `rows × cols` matrix of type `ty`: 64 distinct quantized rows, tiled (real
/// block contents, no hour of quantizing).
fn tiled_weights(
    gpu: &Gpu,
    rng: &mut Rng,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    n: usize,
) -> Result<Vec<tandem_cuda::CudaSlice<u8>>> {
    let row_bytes = ty.row_bytes(cols as u64).context("row size")? as usize;
    let mut tile = vec![0u8; 64 * row_bytes];
    for r in 0..64 {
        let src: Vec<f32> = (0..cols).map(|_| rng.normal() * 0.05).collect();
        tandem_quant::quantize_row(ty, &src, &mut tile[r * row_bytes..(r + 1) * row_bytes])?;
    }
    let host: Vec<u8> = tile.iter().copied().cycle().take(rows * row_bytes).collect();
    Ok((0..n).map(|_| gpu.upload(&host)).collect::<Result<_, _>>()?)
}

/// Deterministic pseudo-random token ids (BOS first when the vocabulary has one).
fn prompt_ids(n: usize, n_vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = Rng(seed | 1);
    (0..n).map(|_| (rng.next() % n_vocab as u64) as u32).collect()
}

fn top2_margin(logits: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &l in logits {
        if l > a {
            b = a;
            a = l;
        } else if l > b {
            b = l;
        }
    }
    a - b
}

fn model_checks(args: &GpuCheckArgs, name: &str, threads: usize, table: &mut Vec<Row>) -> Result<()> {
    let path = crate::registry::resolve(name)?;
    let short = path
        .file_name()
        .map_or(name.to_string(), |f| f.to_string_lossy().into_owned());
    let cpu_model = Model::load(&path, threads).with_context(|| format!("loading {}", path.display()))?;
    let n_vocab = cpu_model.config.n_vocab;
    let mut cpu = Engine::new(cpu_model);
    let gpu_model = tandem_runtime::load_cuda(Model::load(&path, threads)?, args.gpu, false, |_, _| {})?;
    let mut gpu = Engine::new(gpu_model);
    let n_ctx = args.prompt + args.gen + 1;
    let prompt = prompt_ids(args.prompt, n_vocab, 7);

    // Greedy: prefill then decode on each backend independently.
    let mut kv_c = cpu.new_sequence(n_ctx);
    let mut kv_g = gpu.try_new_sequence(n_ctx)?;
    let t0 = Instant::now();
    let mut lc = cpu.prefill(&mut kv_c, &prompt, args.prefill_chunk)?;
    let cpu_prefill = t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    let mut lg = gpu.prefill(&mut kv_g, &prompt, args.prefill_chunk)?;
    let gpu_prefill = t0.elapsed().as_secs_f64();
    let mut max_rel = 0f64;
    let mut agreed = 0;
    let mut stopped_at = None;
    let mut diverged = None;
    for step in 0..args.gen {
        let reference: Vec<f64> = lc.iter().map(|&v| v as f64).collect();
        max_rel = max_rel.max(rel_err(&lg, &reference));
        let (tc, tg) = (sampling::argmax(&lc), sampling::argmax(&lg));
        let margin = top2_margin(&lc);
        if margin < 0.1 {
            stopped_at = Some((step, margin));
            break;
        }
        if tc != tg {
            diverged = Some((step, margin));
            break;
        }
        agreed += 1;
        lc = cpu.forward(&mut kv_c, &[tc], LogitRows::Last)?;
        lg = gpu.forward(&mut kv_g, &[tg], LogitRows::Last)?;
    }
    let how = match (diverged, stopped_at) {
        (Some((s, m)), _) => format!("DIVERGED at step {s} (CPU margin {m:.3})"),
        (None, Some((s, m))) => format!("stopped at step {s}: CPU margin {m:.3} < 0.1"),
        _ => "all steps".into(),
    };
    table.push(Row {
        check: format!(
            "{short}: greedy CPU vs GPU, {}-token prompt in chunks of {}",
            args.prompt, args.prefill_chunk
        ),
        result: format!(
            "{agreed} of {} steps equal ({how}); max rel logit err {max_rel:.2e}; prefill CPU {cpu_prefill:.1}s, GPU {gpu_prefill:.2}s",
            args.gen
        ),
        pass: diverged.is_none(),
    });

    // Decode steps replayed from a captured CUDA graph give the bits of direct launches.
    let steps = 24.min(args.gen);
    let ahead_before = gpu.model.graphs.ahead_taken.get();
    let mut runs = Vec::new();
    for graphs in [false, true] {
        gpu.model.graphs.enabled.set(graphs);
        let mut kv = gpu.try_new_sequence(n_ctx)?;
        let mut logits = gpu.prefill(&mut kv, &prompt[..prompt.len().min(600)], 512)?;
        let mut rows = Vec::new();
        let t0 = Instant::now();
        for _ in 0..steps {
            let next = sampling::argmax(&logits);
            logits = gpu.forward(&mut kv, &[next], LogitRows::Last)?;
            rows.push(logits.clone());
        }
        runs.push((rows, t0.elapsed().as_secs_f64() / steps as f64));
    }
    let graphs_used = gpu.model.graphs.enabled.get();
    // From the fourth replayed step on (capture, one replay, then one made ahead), unless turned off.
    let ahead = gpu.model.graphs.ahead_taken.get() - ahead_before;
    let ahead_ok = !graphs_used || !gpu.model.graphs.ahead_enabled || steps < 4 || ahead > 0;
    let same = runs[0]
        .0
        .iter()
        .zip(&runs[1].0)
        .all(|(a, b)| a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()));
    table.push(Row {
        check: format!("{short}: {steps} decode steps, CUDA graph replay vs direct launches"),
        result: format!(
            "{}; {:.2} ms/step direct, {:.2} ms/step with graphs ({ahead} steps with parameters made ahead){}",
            if same { "bit-identical" } else { "DIFFERENT" },
            runs[0].1 * 1e3,
            runs[1].1 * 1e3,
            if graphs_used {
                ""
            } else {
                " (capture failed: graphs off)"
            }
        ),
        pass: same && graphs_used && ahead_ok,
    });

    // Batched decode steps: on the tensor cores over the quantized weights (3 and 8 rows) and through
    // cuBLAS (20 rows), each replayed from graphs.
    batch_graphs::batch_graph_rows(&mut gpu, &short, &prompt, &[3, 8, 20], table)?;
    // Batched decode against the same sequences alone: the batch routes' rounding, at sizes the
    // small-batch kernels (4 rows) and cuBLAS (12, 16, 24) take.
    batch_graphs::batch_vs_lone_rows(&mut gpu, &short, &prompt, &[4, 12, 16, 24], table)?;

    // Default mode first: its hashes differ across chunkings (the GEMM and flash routes).
    let hash_prompt = prompt_ids(args.hash_prompt, n_vocab, 11);
    let fast: Vec<String> = args
        .chunks
        .iter()
        .map(|&chunk| -> Result<String> {
            let mut kv = gpu.try_new_sequence(hash_prompt.len())?;
            Ok(gpu
                .score(&mut kv, &hash_prompt, &ScoreOptions::chunked(chunk))?
                .logits_sha256)
        })
        .collect::<Result<_>>()?;
    // Deterministic mode as `--deterministic` loads it: the kernels fixed by weight type and summation
    // order, so the hash does not depend on this run's timings. (Setting the flag on the default load
    // would keep whatever its timing picked, split-K variants included: still chunk-invariant, but a
    // hash that moves between runs.)
    drop(gpu);
    let det_model = tandem_runtime::load_cuda(Model::load(&path, threads)?, args.gpu, true, |_, _| {})?;
    let mut det = Engine::new(det_model);
    let mut hashes = Vec::new();
    for &chunk in &args.chunks {
        let mut kv = det.try_new_sequence(hash_prompt.len())?;
        let t0 = Instant::now();
        let r = det.score(&mut kv, &hash_prompt, &ScoreOptions::chunked(chunk))?;
        hashes.push((chunk, r.logits_sha256, t0.elapsed().as_secs_f64()));
    }
    let same = hashes.iter().all(|h| h.1 == hashes[0].1);
    let fast_same = fast.iter().all(|h| *h == fast[0]);
    table.push(Row {
        check: format!("{short}: deterministic logits_sha256, chunks {:?}", args.chunks),
        result: format!(
            "{} ({}); default mode {}",
            if same { "identical" } else { "DIFFERENT" },
            hashes
                .iter()
                .map(|(c, h, s)| format!("{c}: {}… {s:.1}s", &h[..12]))
                .collect::<Vec<_>>()
                .join(", "),
            if fast_same {
                "identical too"
            } else {
                "differs across chunkings, as expected of the GEMM and flash routes"
            }
        ),
        pass: same,
    });
    Ok(())
}
