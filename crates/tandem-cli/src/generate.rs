//! `tandem run` (one prompt, streamed) and `tandem chat` (an interactive REPL with the chat template).

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;
use tandem_cuda::{CudaModel, ExpertBudget, ExpertDecode, ExpertOffload};
use tandem_engine::{Engine, GenerateOptions, SamplingParams, Timings};
use tandem_model::expert_stream::{ExpertStreamMode, StreamDepth};
use tandem_model::{Model, SequenceCache};
use tandem_runtime::{on_engine, AnyEngine, Device, DeviceModel, EngineBackend};
use tandem_tokenizer::{ChatMessage, ChatTemplate, Tokenizer};

use crate::spec::{SpecArgs, Speculator};

/// Options shared by every command that loads a model and runs it.
#[derive(Args, Clone)]
pub struct ModelArgs {
    /// A GGUF path or a known model alias (pulled on first use).
    #[arg(long, short = 'm', default_value = crate::registry::DEFAULT_MODEL)]
    pub model: String,
    /// Worker threads (default: all cores).
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// Context size in tokens (default: the model's, at most 8192).
    #[arg(long)]
    pub ctx: Option<usize>,
    /// Rows per prefill chunk (1 = every prompt token through the decode route).
    #[arg(long, default_value_t = tandem_engine::DEFAULT_PREFILL_CHUNK)]
    pub prefill_chunk: usize,
    /// Print model, memory and route details to stderr.
    #[arg(long, short = 'v')]
    pub verbose: bool,
    /// Where the model runs.
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    pub device: DeviceArg,
    /// Which GPU, with `--device cuda`.
    #[arg(long, default_value_t = 0)]
    pub gpu: usize,
    /// GPU: take the matvec route for every matmul, so logits are bit-identical across chunk sizes
    /// and batches (the CPU always is).
    #[arg(long)]
    pub deterministic: bool,
    #[command(flatten)]
    pub experts: ExpertArgs,
}

impl ModelArgs {
    /// The device the flags name.
    pub fn device(&self) -> Device {
        self.device.device(self.gpu, self.deterministic, self.experts.offload())
    }
}

/// Where a mixture's experts live on the GPU, and how prefill streams those in host memory.
#[derive(Args, Clone, Debug)]
pub struct ExpertArgs {
    /// GPU: bytes of a mixture's experts kept on the device (`all`, `auto`, or a size such as 0, 512M,
    /// 20G). The others stay in page-locked host memory and pass through device slots: staged as
    /// routed for decode and short chunks, streamed for prefill chunks of 1,024 rows or more.
    #[arg(long = "gpu-expert-budget", default_value = "all", value_name = "BYTES")]
    pub gpu_expert_budget: ExpertBudget,
    /// GPU: how a long prefill chunk streams the experts in host memory: `routed` copies every one
    /// except those no row routes to (skipped once a layer's routing is known), `all` copies every
    /// one, `off` stages only the routed ones, layer by layer. The logits are the same bits either way.
    #[arg(long = "expert-stream", default_value = "routed", value_name = "MODE")]
    pub expert_stream: ExpertStreamMode,
    /// GPU: expert copies queued ahead of the host-to-device link (1 to 256).
    #[arg(long = "expert-stream-depth", default_value = "16", value_name = "N")]
    pub expert_stream_depth: StreamDepth,
    /// GPU: where decode steps compute a routed expert kept in host memory: `gpu` copies it into a
    /// device slot (a cache), `cpu` computes it on the CPU from the model file (as llama.cpp's
    /// `--n-cpu-moe`), `auto` runs experts already in a slot on the GPU and the others on the side
    /// whose decode steps the first steps, alternating, measured faster (always the GPU under
    /// `--deterministic`).
    #[arg(long = "expert-decode", default_value = "auto", value_name = "WHERE")]
    pub expert_decode: ExpertDecode,
    /// Print each streamed chunk's copied and skipped experts and the link's rate to stderr.
    #[arg(long)]
    pub trace: bool,
}

impl ExpertArgs {
    pub fn offload(&self) -> ExpertOffload {
        ExpertOffload {
            budget: self.gpu_expert_budget,
            decode: self.expert_decode,
            stream: self.expert_stream,
            depth: self.expert_stream_depth,
            trace: self.trace,
        }
    }
}

/// `--device`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceArg {
    Cpu,
    Cuda,
}

impl DeviceArg {
    /// The device with `--gpu`, `--deterministic` and the expert placement (which only a GPU reads).
    pub fn device(self, gpu: usize, deterministic: bool, offload: ExpertOffload) -> Device {
        match self {
            DeviceArg::Cpu => Device::Cpu,
            DeviceArg::Cuda => Device::Cuda {
                gpu,
                deterministic,
                offload,
            },
        }
    }
}

#[derive(Args, Clone)]
pub struct SamplingArgs {
    /// Maximum tokens to generate.
    #[arg(short = 'n', long = "max-tokens", default_value_t = 128)]
    pub max_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl SamplingArgs {
    pub fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
            ..SamplingParams::default()
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    Text,
    Json,
}

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
    /// Read the prompt from a file.
    #[arg(long, conflicts_with = "prompt")]
    pub prompt_file: Option<PathBuf>,
    /// The prompt (raw text; `tandem chat` applies the chat template).
    pub prompt: Option<String>,
    /// Parse special tokens such as `<start_of_turn>` in the prompt.
    #[arg(long)]
    pub special: bool,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output_format: OutputFormat,
}

/// A loaded model with its tokenizer.
pub struct Loaded {
    pub engine: AnyEngine,
    pub tokenizer: Tokenizer,
    pub n_ctx: usize,
}

pub fn load(args: &ModelArgs) -> Result<Loaded> {
    let path = crate::registry::resolve(&args.model)?;
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let file = tandem_gguf::GgufFile::open(&path)?;
    let tokenizer = Tokenizer::from_gguf(&file).with_context(|| format!("tokenizer of {}", path.display()))?;
    let model = Model::from_file(file, threads).with_context(|| format!("loading {}", path.display()))?;
    let n_ctx = args.ctx.unwrap_or(model.config.context_length.min(8192)).max(1);
    if args.verbose {
        print_model(&path, &model, threads);
    }
    let engine = place(model, args.device(), args.verbose)?.into_engine();
    Ok(Loaded {
        engine,
        tokenizer,
        n_ctx,
    })
}

/// The `--draft-model` of `spec`, loaded on the device and with the other flags of `target`.
pub fn load_draft(spec: &SpecArgs, target: &ModelArgs) -> Result<Option<AnyEngine>> {
    let Some(path) = &spec.draft_model else {
        return Ok(None);
    };
    let args = ModelArgs {
        model: path.clone(),
        verbose: false,
        ..target.clone()
    };
    let loaded = load(&args).with_context(|| format!("draft model {path}"))?;
    Ok(Some(loaded.engine))
}

/// The model's shape, for `--verbose`.
pub fn print_model(path: &Path, model: &Model, threads: usize) {
    let c = &model.config;
    eprintln!(
        "model: {} ({:?}), {} layers, d_model {}, {} heads / {} kv heads × {}, vocab {}, {} threads",
        path.display(),
        c.arch,
        c.n_layer(),
        c.d_model,
        c.n_head,
        c.n_kv_head,
        c.head_dim,
        c.n_vocab,
        threads
    );
    let windows: Vec<String> = c
        .layers
        .iter()
        .map(|l| l.window.map_or("global".into(), |w| w.to_string()))
        .collect();
    eprintln!("layers: [{}]", windows.join(", "));
    if let Some(m) = c.moe {
        eprintln!(
            "experts: {} of {} a row, {} wide",
            m.n_expert_used, m.n_expert, m.d_ff_expert
        );
    }
    let used = c.moe.map_or(0, |m| m.n_expert_used);
    eprintln!(
        "weights streamed per decode step: {:.1} MB",
        model.weights.decode_bytes(used) as f64 / 1e6
    );
}

/// Puts the model on `device`; on a GPU with a progress bar for the upload, and a clear error on a
/// machine without one.
pub fn place(model: Model, device: Device, verbose: bool) -> Result<DeviceModel> {
    let Device::Cuda { .. } = device else {
        return Ok(DeviceModel::place(model, device, |_, _| {})?);
    };
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("uploading weights {bar:30} {bytes}/{total_bytes}")
            .expect("a valid progress template"),
    );
    let placed = DeviceModel::place(model, device, |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })
    .context("--device cuda")?;
    bar.finish_and_clear();
    if let (true, DeviceModel::Cuda(cuda)) = (verbose, &placed) {
        print_gpu(cuda);
    }
    Ok(placed)
}

/// The GPU and what the weights take on it, for `--verbose`.
fn print_gpu(cuda: &CudaModel) {
    let m = &cuda.weights.memory;
    eprintln!(
        "gpu: {} ({}), {:.1} GB; weights {:.1} MB quantized{} + {:.1} MB f16 for the GEMM route{} + {:.2} MB norms",
        cuda.gpu.name,
        cuda.gpu.arch,
        cuda.gpu.total_mem as f64 / 1e9,
        m.weights_quantized as f64 / 1e6,
        if m.tied_output_int8 > 0 {
            format!(
                " + {:.1} MB integer-route copy of the tied output head",
                m.tied_output_int8 as f64 / 1e6
            )
        } else {
            String::new()
        },
        m.weights_f16 as f64 / 1e6,
        if cuda.routes.deterministic {
            " (none: deterministic)"
        } else {
            ""
        },
        m.norms as f64 / 1e6
    );
    if m.experts_host > 0 {
        eprintln!(
            "gpu: experts beyond the budget: {:.1} MB in page-locked host memory, through {:.1} MB of device slots",
            m.experts_host as f64 / 1e6,
            m.expert_slots as f64 / 1e6
        );
    }
    for choice in cuda.decode_choices() {
        eprintln!("gpu: decode kernel {choice}");
    }
}

/// What the generic command bodies need besides the engine.
struct LoadedInfo<'a> {
    tokenizer: &'a Tokenizer,
    n_ctx: usize,
}

fn print_kv<K: SequenceCache>(n_ctx: usize, kv: &K) {
    eprintln!(
        "kv cache: {} positions, {:.2} MB allocated, {:.2} MB at the full context of {} (f16)",
        kv.len(),
        kv.bytes_allocated() as f64 / 1e6,
        kv.bytes_at_capacity() as f64 / 1e6,
        n_ctx
    );
}

/// On the GPU: device memory in use, split into weights, KV and the rest (activations, attention
/// partials, cuBLAS workspace, the CUDA runtime).
fn print_gpu_memory(engine: &AnyEngine, kv_bytes: usize) {
    if let AnyEngine::Cuda(e) = engine {
        print_cuda_memory(&e.model, kv_bytes);
    }
}

pub fn print_cuda_memory(cuda: &CudaModel, kv_bytes: usize) {
    if let Ok((free, total)) = cuda.gpu.mem_info() {
        let m = &cuda.weights.memory;
        let used = total - free;
        let weights = m.weights_quantized + m.tied_output_int8 + m.weights_f16 + m.norms + m.expert_slots;
        let other = used.saturating_sub(weights + kv_bytes);
        eprintln!(
            "gpu memory: {:.1} MB in use = weights {:.1} + kv {:.1} + workspaces and runtime {:.1}",
            used as f64 / 1e6,
            weights as f64 / 1e6,
            kv_bytes as f64 / 1e6,
            other as f64 / 1e6
        );
    }
}

fn print_timings(t: &Timings) {
    eprintln!(
        "\nprompt {} tokens: TTFT {:.1} ms, prefill {:.1} tok/s; decode {} tokens, {:.1} tok/s",
        t.prompt_tokens,
        t.ttft.as_secs_f64() * 1e3,
        t.prefill_tok_s(),
        t.decode_tokens,
        t.decode_tok_s()
    );
}

pub fn run(args: &RunArgs) -> Result<()> {
    let prompt = match (&args.prompt_file, &args.prompt) {
        (Some(p), _) => std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
        (None, Some(p)) => p.clone(),
        (None, None) => bail!("give a prompt or --prompt-file"),
    };
    let Loaded {
        mut engine,
        tokenizer,
        n_ctx,
    } = load(&args.model)?;
    let info = LoadedInfo {
        tokenizer: &tokenizer,
        n_ctx,
    };
    args.spec.settings()?;
    let mut draft = load_draft(&args.spec, &args.model)?;
    let kv_bytes = on_engine!(&mut engine, |e| run_on(e, &info, &prompt, args, draft.take()))?;
    if args.model.verbose {
        print_gpu_memory(&engine, kv_bytes);
    }
    Ok(())
}

/// Generates on any backend; returns the bytes the sequence's KV cache held.
fn run_on<B: EngineBackend>(
    engine: &mut Engine<B>,
    loaded: &LoadedInfo,
    prompt: &str,
    args: &RunArgs,
    draft: Option<AnyEngine>,
) -> Result<usize> {
    let ids = loaded.tokenizer.try_encode(prompt, true, args.special)?;
    let params = args.sampling.params();
    let chunk = args.model.prefill_chunk;
    let mut spec = Speculator::new(&args.spec, engine, draft, loaded.n_ctx, chunk, &params)?;
    let opts = GenerateOptions {
        max_tokens: args.sampling.max_tokens,
        prefill_chunk: args.model.prefill_chunk,
        sampling: args.sampling.params(),
        stop_ids: loaded.tokenizer.eog_ids(),
    };
    let mut kv = engine.try_new_sequence(loaded.n_ctx)?;
    let mut stream = loaded.tokenizer.stream_decoder(false);
    let text_mode = args.output_format == OutputFormat::Text;
    let mut stdout = std::io::stdout().lock();
    if text_mode {
        write!(stdout, "{prompt}")?;
        stdout.flush()?;
    }
    let (completion, timings) = spec.generate(engine, &mut kv, &ids, &opts, |id| {
        if text_mode {
            let piece = stream.push(id);
            // A closed pipe ends generation rather than the process.
            write!(stdout, "{piece}").and_then(|_| stdout.flush()).is_ok()
        } else {
            true
        }
    })?;
    if text_mode {
        writeln!(stdout, "{}", stream.flush())?;
    } else {
        let out = json!({
            "prompt_ids": ids,
            "completion_ids": completion,
            "text": loaded.tokenizer.decode(&completion, false),
            "timings": {
                "prompt_tokens": timings.prompt_tokens,
                "ttft_ms": timings.ttft.as_secs_f64() * 1e3,
                "prefill_tok_s": timings.prefill_tok_s(),
                "decode_tokens": timings.decode_tokens,
                "decode_tok_s": timings.decode_tok_s(),
            },
            "speculative": spec.enabled().then(|| spec.json()),
        });
        writeln!(stdout, "{out}")?;
    }
    print_timings(&timings);
    if spec.enabled() {
        eprintln!("{}", spec.summary());
    }
    if args.model.verbose {
        print_kv(loaded.n_ctx, &kv);
    }
    Ok(kv.bytes_allocated())
}

#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
    /// A system message.
    #[arg(long)]
    pub system: Option<String>,
}

/// An interactive conversation. Each turn re-renders the whole conversation with the chat template and
/// feeds only what the cache has not seen yet (the cached tokens are a prefix of the new prompt).
pub fn chat(args: &ChatArgs) -> Result<()> {
    let Loaded {
        mut engine,
        tokenizer,
        n_ctx,
    } = load(&args.model)?;
    // The model keeps its mapped file: read the template from it rather than opening it again.
    let template = ChatTemplate::from_gguf(&engine.cpu_model().file)?;
    let info = LoadedInfo {
        tokenizer: &tokenizer,
        n_ctx,
    };
    args.spec.settings()?;
    let mut draft = load_draft(&args.spec, &args.model)?;
    on_engine!(&mut engine, |e| chat_on(e, &info, &template, args, draft.take()))
}

fn chat_on<B: EngineBackend>(
    engine: &mut Engine<B>,
    loaded: &LoadedInfo,
    template: &ChatTemplate,
    args: &ChatArgs,
    draft: Option<AnyEngine>,
) -> Result<()> {
    let mut messages: Vec<ChatMessage> = args.system.iter().map(ChatMessage::system).collect();
    let params = args.sampling.params();
    let chunk = args.model.prefill_chunk;
    let mut spec = Speculator::new(&args.spec, engine, draft, loaded.n_ctx, chunk, &params)?;
    let mut kv = engine.try_new_sequence(loaded.n_ctx)?;
    let mut cached: Vec<u32> = Vec::new();
    let stdin = std::io::stdin();
    eprintln!("tandem chat: type a message, an empty line or Ctrl-D to quit");
    loop {
        eprint!("> ");
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 || line.trim().is_empty() {
            break;
        }
        messages.push(ChatMessage::user(line.trim_end()));
        let prompt = template.render(&messages, true)?;
        let ids = loaded.tokenizer.try_encode(&prompt, true, true)?;
        // Strip the BOS the template may have written besides the tokenizer's own.
        let ids = dedup_bos(loaded.tokenizer, ids);
        let (earlier, new) = if ids.starts_with(&cached) && cached.len() < ids.len() {
            ids.split_at(cached.len())
        } else {
            kv = engine.try_new_sequence(loaded.n_ctx)?;
            cached.clear();
            (&[][..], &ids[..])
        };
        let opts = GenerateOptions {
            max_tokens: args.sampling.max_tokens,
            prefill_chunk: args.model.prefill_chunk,
            sampling: args.sampling.params(),
            stop_ids: loaded.tokenizer.eog_ids(),
        };
        let mut stream = loaded.tokenizer.stream_decoder(false);
        let mut out = std::io::stdout().lock();
        let (completion, timings) = spec.generate_after(earlier, engine, &mut kv, new, &opts, |id| {
            let piece = stream.push(id);
            write!(out, "{piece}").and_then(|_| out.flush()).is_ok()
        })?;
        writeln!(out, "{}", stream.flush())?;
        cached = ids.clone();
        cached.extend(&completion);
        // The last sampled token was never fed to the model: the cache holds everything before it.
        cached.pop();
        let reply = loaded.tokenizer.decode(&completion, false);
        messages.push(ChatMessage::assistant(reply.trim_end()));
        if args.model.verbose {
            print_timings(&timings);
            if spec.enabled() {
                eprintln!("{}", spec.summary());
            }
            print_kv(loaded.n_ctx, &kv);
        }
    }
    Ok(())
}

fn dedup_bos(tok: &Tokenizer, mut ids: Vec<u32>) -> Vec<u32> {
    if let Some(bos) = tok.bos() {
        while ids.len() >= 2 && ids[0] == bos && ids[1] == bos {
            ids.remove(0);
        }
    }
    ids
}
