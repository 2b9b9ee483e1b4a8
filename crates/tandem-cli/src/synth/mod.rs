//! `tandem synth`: a GGUF model with random weights of a real architecture's shapes, loadable by Tandem
//! and llama.cpp alike. The same seed gives the same bytes on any machine and any thread count: every
//! row draws from its own generator, seeded from (seed, tensor name, row). Tensors stream to disk in
//! chunks, so memory stays bounded however large the model.

pub mod mix;
pub mod rng;
pub mod shapes;

use std::fs::File;
use std::io::BufWriter;
use std::path::Path;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use rayon::prelude::*;
use tandem_gguf::{Array, GgmlType, GgufWriter, Value};

use mix::QuantMix;
use rng::Rng;
use shapes::{Arch, Role, Shape};

/// Seeds each router row's width apart from its values, so a skewed file keeps the uniform one's
/// directions.
const ROUTE_SKEW_SALT: u64 = 0x5ca1_ab1e_0dd5_eed5;

/// Bytes of f32 source generated per chunk before it is quantized and written.
const CHUNK_F32_BYTES: u64 = 64 << 20;

pub struct SynthOptions<'a> {
    pub shape: &'a Shape,
    pub mix: QuantMix,
    pub seed: u64,
    /// Write `tokenizer.ggml.model = none` instead of a byte-level BPE vocabulary.
    pub no_vocab: bool,
    /// How unevenly a mixture's router spreads rows over experts: each expert's router row is scaled
    /// by `exp(route_skew × z)` (z standard normal, per layer and expert), so experts with wide rows
    /// win the top-k far more often. 0 (uniform random routers) routes every expert of a 512-row
    /// chunk; about 1 leaves a realistic share of experts unrouted.
    pub route_skew: f32,
    pub progress: bool,
}

/// Declares metadata and tensors for a synthetic model.
pub fn declare(opts: &SynthOptions) -> Result<(GgufWriter, Vec<(shapes::TensorSpec, GgmlType)>)> {
    let s = opts.shape;
    let mut w = GgufWriter::new();
    let arch = s.arch.gguf_name();
    let k = |suffix: &str| format!("{arch}.{suffix}");
    w.add_metadata("general.architecture", arch)?;
    w.add_metadata("general.type", "model")?;
    let skew = if opts.route_skew == 0.0 {
        String::new()
    } else {
        format!(" route-skew {}", opts.route_skew)
    };
    w.add_metadata(
        "general.name",
        format!("tandem-synth {} {} seed {}{skew}", s.name, opts.mix.name(), opts.seed),
    )?;
    w.add_metadata(&k("vocab_size"), Value::U32(s.n_vocab as u32))?;
    w.add_metadata(&k("context_length"), Value::U32(s.context as u32))?;
    w.add_metadata(&k("embedding_length"), Value::U32(s.d_model as u32))?;
    w.add_metadata(&k("block_count"), Value::U32(s.n_layer as u32))?;
    w.add_metadata(&k("feed_forward_length"), Value::U32(s.d_ff as u32))?;
    w.add_metadata(&k("attention.head_count"), Value::U32(s.n_head as u32))?;
    w.add_metadata(&k("attention.head_count_kv"), Value::U32(s.n_kv_head as u32))?;
    w.add_metadata(&k("attention.layer_norm_rms_epsilon"), Value::F32(s.eps))?;
    w.add_metadata(&k("rope.freq_base"), Value::F32(s.rope_base))?;
    match s.arch {
        Arch::Llama => w.add_metadata(&k("rope.dimension_count"), Value::U32(s.head_dim as u32))?,
        Arch::Qwen3 | Arch::Qwen3Moe => {
            w.add_metadata(&k("attention.key_length"), Value::U32(s.head_dim as u32))?;
            w.add_metadata(&k("attention.value_length"), Value::U32(s.head_dim as u32))?;
            if s.arch == Arch::Qwen3Moe {
                w.add_metadata(&k("expert_count"), Value::U32(s.n_expert as u32))?;
                w.add_metadata(&k("expert_used_count"), Value::U32(s.n_expert_used as u32))?;
                w.add_metadata(&k("expert_feed_forward_length"), Value::U32(s.d_ff_expert as u32))?;
            }
        }
        Arch::Gemma3 => {
            w.add_metadata(&k("attention.key_length"), Value::U32(s.head_dim as u32))?;
            w.add_metadata(&k("attention.value_length"), Value::U32(s.head_dim as u32))?;
            w.add_metadata(&k("attention.sliding_window"), Value::U32(s.sliding_window as u32))?;
            if let Some(f) = s.rope_scaling_factor {
                w.add_metadata(&k("rope.scaling.type"), "linear")?;
                w.add_metadata(&k("rope.scaling.factor"), Value::F32(f))?;
            }
        }
    }
    w.add_metadata("general.file_type", Value::U32(opts.mix.file_type()))?;
    w.add_metadata("general.quantization_version", Value::U32(2))?;
    add_tokenizer(&mut w, s.n_vocab, opts.no_vocab)?;

    let mut planned = Vec::new();
    for t in s.tensors() {
        // A tied embedding is also the output projection, and llama.cpp quantizes it as one.
        let role = if t.role == Role::Embedding && s.tied_output {
            Role::Output
        } else {
            t.role
        };
        let ty = opts.mix.type_for(role, t.layer, s.n_layer, t.dims[0]);
        w.add_tensor(&t.name, &t.dims, ty)?;
        planned.push((t, ty));
    }
    Ok((w, planned))
}

/// A byte-level BPE vocabulary: the 256 byte symbols, BOS/EOS, then unused fillers up to `n_vocab`.
/// No merges, so every byte is a token: enough for text in and text out on a random model.
fn add_tokenizer(w: &mut GgufWriter, n_vocab: u64, no_vocab: bool) -> Result<()> {
    if no_vocab {
        w.add_metadata("tokenizer.ggml.model", "none")?;
        return Ok(());
    }
    let mut tokens: Vec<String> = (0u8..=255).map(gpt2_byte_char).map(String::from).collect();
    let mut types = vec![1i32; 256];
    tokens.push("<|begin_of_text|>".into());
    tokens.push("<|end_of_text|>".into());
    types.extend([3, 3]);
    while (tokens.len() as u64) < n_vocab {
        tokens.push(format!("<|reserved_{}|>", tokens.len()));
        types.push(5);
    }
    w.add_metadata("tokenizer.ggml.model", "gpt2")?;
    w.add_metadata("tokenizer.ggml.pre", "default")?;
    w.add_metadata("tokenizer.ggml.tokens", Array::String(tokens))?;
    w.add_metadata("tokenizer.ggml.token_type", Array::I32(types))?;
    w.add_metadata("tokenizer.ggml.merges", Array::String(vec![]))?;
    w.add_metadata("tokenizer.ggml.bos_token_id", Value::U32(256))?;
    w.add_metadata("tokenizer.ggml.eos_token_id", Value::U32(257))?;
    w.add_metadata("tokenizer.ggml.add_bos_token", Value::Bool(true))?;
    Ok(())
}

/// GPT-2's byte → printable character map.
fn gpt2_byte_char(b: u8) -> char {
    let printable = |b: u8| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    if printable(b) {
        return char::from(b);
    }
    let n = (0u8..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).expect("GPT-2 byte map stays in the BMP")
}

/// The value distribution of a tensor: norms near 1, matrices scaled by fan-in so activations keep their
/// size, embeddings wide enough that the logits have real margins.
///
/// A model with its own output matrix gets real margins the way a tied one does (where the residual
/// stream carries the token's embedding and the output reads it back): the output rows repeat the
/// embedding rows (`tensor_seed`), and the matrices that write into the residual stream are scaled down
/// so the layers perturb the embedding rather than drown it. Gemma's tied shapes keep their scales.
fn scale_for(role: Role, row_len: u64, untied: bool) -> (f32, f32) {
    let fan_in = (row_len as f32).sqrt();
    match role {
        Role::Norm => (1.0, 0.05),
        Role::Embedding | Role::Output => (0.0, 4.0 / fan_in),
        Role::AttnOutput | Role::FfnDown if untied => (0.0, 0.02 / fan_in),
        _ => (0.0, 1.0 / fan_in),
    }
}

/// The seed of a tensor's values: an untied output repeats the embedding's rows.
fn tensor_seed(seed: u64, spec: &shapes::TensorSpec, untied: bool) -> u64 {
    if untied && spec.role == Role::Output {
        rng::seed_for(seed, "token_embd.weight")
    } else {
        rng::seed_for(seed, &spec.name)
    }
}

pub fn write(opts: &SynthOptions, path: &Path) -> Result<()> {
    let (writer, planned) = declare(opts)?;
    let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut sink = writer.write_header(BufWriter::with_capacity(8 << 20, file))?;
    let bar = if opts.progress {
        ProgressBar::new(writer.file_size())
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("synth [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta} {msg}")
            .expect("static template")
            .progress_chars("=> "),
    );
    for (spec, ty) in &planned {
        bar.set_message(spec.name.clone());
        let row_len = spec.dims[0];
        let n_rows: u64 = spec.dims[1..].iter().product();
        let row_bytes = ty.row_bytes(row_len).context("row size")? as usize;
        let rows_per_chunk = (CHUNK_F32_BYTES / (row_len * 4)).clamp(1, n_rows);
        let untied = !opts.shape.tied_output;
        let tensor_seed = tensor_seed(opts.seed, spec, untied);
        let (mean, std) = scale_for(spec.role, row_len, untied);
        let skew = if spec.role == Role::Router {
            opts.route_skew
        } else {
            0.0
        };
        let mut chunk_start = 0;
        while chunk_start < n_rows {
            let rows = rows_per_chunk.min(n_rows - chunk_start);
            let mut out = vec![0u8; rows as usize * row_bytes];
            out.par_chunks_mut(row_bytes).enumerate().try_for_each(|(i, dst)| {
                let row = chunk_start + i as u64;
                let mut rng = Rng::new(rng::mix(tensor_seed, row));
                let std = if skew == 0.0 {
                    std
                } else {
                    std * (skew * Rng::new(rng::mix(tensor_seed ^ ROUTE_SKEW_SALT, row)).normal()).exp()
                };
                let src: Vec<f32> = (0..row_len).map(|_| mean + std * rng.normal()).collect();
                tandem_quant::quantize_row(*ty, &src, dst)
            })?;
            sink.write(&out)?;
            bar.inc(out.len() as u64);
            chunk_start += rows;
        }
    }
    sink.finish()?;
    bar.finish_and_clear();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_byte_map_is_a_bijection() {
        let chars: std::collections::HashSet<char> = (0u8..=255).map(gpt2_byte_char).collect();
        assert_eq!(chars.len(), 256);
        assert_eq!(gpt2_byte_char(b'A'), 'A');
        assert_eq!(gpt2_byte_char(b' '), 'Ġ');
        assert_eq!(gpt2_byte_char(b'\n'), 'Ċ');
    }
    /// The bytes of a small model with whole K-quant rows (256 wide), pinned: the same seed must give
    /// the same file in every version (the synthetic models are compared across sessions and with
    /// llama.cpp by their bytes). Pinned from 9e3a682, before the quantizers were rewritten for speed.
    #[test]
    fn the_same_seed_gives_the_pinned_bytes() {
        use sha2::{Digest, Sha256};
        let shape = Shape {
            name: "pin-256",
            n_vocab: 512,
            d_model: 256,
            n_layer: 2,
            n_head: 4,
            n_kv_head: 2,
            head_dim: 64,
            d_ff: 512,
            ..shapes::SHAPES[0].clone()
        };
        let dir = std::env::temp_dir().join(format!("tandem-synth-pin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut got = Vec::new();
        for mix in ["q4_k_m", "q5_k_m", "q2_k", "q3_k", "q6_k", "q8_0"] {
            let opts = SynthOptions {
                shape: &shape,
                mix: QuantMix::parse(mix).unwrap(),
                seed: 7,
                no_vocab: true,
                route_skew: 0.0,
                progress: false,
            };
            let path = dir.join(format!("{mix}.gguf"));
            write(&opts, &path).unwrap();
            let digest = Sha256::digest(std::fs::read(&path).unwrap());
            got.push(format!(
                "{mix} {}",
                digest.iter().take(8).map(|b| format!("{b:02x}")).collect::<String>()
            ));
        }
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(got, PINNED);
    }

    const PINNED: [&str; 6] = [
        "q4_k_m 34800bbbe0afa0b2",
        "q5_k_m f2e6c461e0c16958",
        "q2_k cbfc67e6640ae91c",
        "q3_k 061b41a6b819abde",
        "q6_k c6276623d520c88a",
        "q8_0 c67aab9349f23a37",
    ];
}
