//! Model hyper-parameters from GGUF metadata, with llama.cpp's defaults where a key is missing.

use tandem_gguf::GgufFile;

use crate::ModelError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Gemma3,
    /// Qwen3: Llama's block with QK-norm and NeoX RoPE.
    Qwen3,
    /// Qwen3-MoE: Qwen3 with every feed-forward block a routed mixture of experts.
    Qwen3Moe,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Silu,
    GeluTanh,
}

/// Which elements RoPE rotates together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (x[2i], x[2i+1]): llama.cpp's "normal" RoPE, used by Llama GGUFs.
    Interleaved,
    /// Halves (x[i], x[i + d/2]): GPT-NeoX style, used by Gemma.
    Neox,
}

/// A layer's rotary embedding, as the model's metadata gives it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    pub style: RopeStyle,
    /// Rotated dimensions per head (≤ head_dim); the rest pass through.
    pub n_rot: usize,
    pub freq_base: f32,
    /// Linear position scaling (1 / factor).
    pub freq_scale: f32,
}

impl RopeParams {
    /// Whether the rotated pairs are halves of the head (NeoX) rather than adjacent elements: the
    /// form the kernels take it in.
    pub fn neox(&self) -> bool {
        self.style == RopeStyle::Neox
    }
}

/// A mixture-of-experts feed-forward block, as llama.cpp's `build_moe_ffn` computes it for Qwen3-MoE:
/// router logits `x · routerᵀ`, a softmax over all experts, the `n_expert_used` most probable (ties
/// to the lower index), their probabilities as weights (renormalised to sum 1 when `norm_weights`),
/// and the weighted sum of those experts' SwiGLU feed-forward outputs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeConfig {
    pub n_expert: usize,
    pub n_expert_used: usize,
    /// Hidden width of one expert's feed-forward block.
    pub d_ff_expert: usize,
    pub norm_weights: bool,
}

/// What differs between layers: the attention span and the rotary embedding.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerSpec {
    /// Sliding window (keys k with p - window < k <= p), or `None` for a global layer.
    pub window: Option<usize>,
    pub rope: RopeParams,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub n_vocab: usize,
    pub d_model: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub d_ff: usize,
    pub eps: f32,
    /// The context the model was trained for.
    pub context_length: usize,
    pub layers: Vec<LayerSpec>,
    /// Multiplies q·k.
    pub attn_scale: f32,
    /// Gemma multiplies the embeddings by sqrt(d_model).
    pub embed_scale: Option<f32>,
    pub activation: Activation,
    /// Gemma 3: RMS norm of each q and k head before RoPE.
    pub qk_norm: bool,
    /// Gemma 3: norms after attention and after the FFN as well as before ("sandwich").
    pub post_norms: bool,
    /// Qwen3-MoE: every layer's feed-forward block is a mixture of experts (`d_ff` is then unused).
    pub moe: Option<MoeConfig>,
}

impl ModelConfig {
    pub fn n_layer(&self) -> usize {
        self.layers.len()
    }

    pub fn q_width(&self) -> usize {
        self.n_head * self.head_dim
    }

    pub fn kv_width(&self) -> usize {
        self.n_kv_head * self.head_dim
    }

    pub fn from_gguf(file: &GgufFile) -> Result<Self, ModelError> {
        let arch_name = file.architecture()?;
        let arch = match arch_name {
            "llama" => Arch::Llama,
            "gemma3" => Arch::Gemma3,
            "qwen3" => Arch::Qwen3,
            "qwen3moe" => Arch::Qwen3Moe,
            other => {
                return Err(ModelError::Unsupported(format!(
                    "architecture {other:?} (llama, gemma3, qwen3, qwen3moe)"
                )))
            }
        };
        let key = |k: &str| format!("{arch_name}.{k}");
        let req = |k: &str| -> Result<usize, ModelError> {
            let name = key(k);
            Ok(file.require(&name, file.get_u64(&name))? as usize)
        };
        let opt_u = |k: &str| -> Result<Option<usize>, ModelError> { Ok(file.get_u64(&key(k))?.map(|v| v as usize)) };
        let opt_f = |k: &str| -> Result<Option<f32>, ModelError> { Ok(file.get_f32(&key(k))?) };

        let d_model = req("embedding_length")?;
        let n_layer = req("block_count")?;
        let n_head = req("attention.head_count")?;
        let n_kv_head = opt_u("attention.head_count_kv")?.unwrap_or(n_head);
        let moe = match arch {
            Arch::Qwen3Moe => Some(moe_config(file, arch_name)?),
            _ => None,
        };
        // A MoE model may leave the dense width out (llama.cpp then derives one it never uses).
        let d_ff = match moe {
            Some(m) => opt_u("feed_forward_length")?.unwrap_or(m.d_ff_expert * m.n_expert_used),
            None => req("feed_forward_length")?,
        };
        let context_length = req("context_length")?;
        if n_head == 0 || n_kv_head == 0 || n_head % n_kv_head != 0 || d_model == 0 || n_layer == 0 {
            return Err(ModelError::Config(format!(
                "inconsistent heads: {n_head} query heads, {n_kv_head} kv heads, d_model {d_model}, {n_layer} layers"
            )));
        }
        let head_dim = opt_u("attention.key_length")?.unwrap_or(d_model / n_head);
        let v_dim = opt_u("attention.value_length")?.unwrap_or(head_dim);
        if v_dim != head_dim || head_dim == 0 || head_dim % 2 != 0 {
            return Err(ModelError::Unsupported(format!(
                "key length {head_dim} with value length {v_dim}"
            )));
        }
        let eps = opt_f("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-5);
        let freq_base = opt_f("rope.freq_base")?.unwrap_or(10_000.0);
        let n_rot = opt_u("rope.dimension_count")?.unwrap_or(head_dim);
        if n_rot > head_dim || n_rot % 2 != 0 {
            return Err(ModelError::Config(format!(
                "rope.dimension_count {n_rot} with head dim {head_dim}"
            )));
        }
        let freq_scale = match (file.get_str(&key("rope.scaling.type"))?, opt_f("rope.scaling.factor")?) {
            (Some("linear"), Some(f)) if f > 0.0 => 1.0 / f,
            (Some("linear"), Some(f)) => return Err(ModelError::Config(format!("rope scaling factor {f}"))),
            (None | Some("none"), _) | (Some("linear"), None) => 1.0,
            (Some(other), _) => return Err(ModelError::Unsupported(format!("rope scaling {other:?}"))),
        };
        let n_vocab = match opt_u("vocab_size")? {
            Some(n) => n,
            None => file
                .tensor_info("token_embd.weight")
                .and_then(|t| t.dims.get(1).copied())
                .ok_or_else(|| ModelError::Config("no vocab_size and no token_embd.weight".into()))?
                as usize,
        };

        let rope = |base: f32, scale: f32, style| RopeParams {
            style,
            n_rot,
            freq_base: base,
            freq_scale: scale,
        };
        let (layers, attn_scale, embed_scale, activation, qk_norm, post_norms) = match arch {
            Arch::Llama => {
                let spec = LayerSpec {
                    window: None,
                    rope: rope(freq_base, freq_scale, RopeStyle::Interleaved),
                };
                (
                    vec![spec; n_layer],
                    1.0 / (head_dim as f32).sqrt(),
                    None,
                    Activation::Silu,
                    false,
                    false,
                )
            }
            Arch::Gemma3 => {
                // llama.cpp's Gemma 3: every 6th layer global, the rest sliding-window with a local RoPE base
                // of 10000 and no scaling; the global layers use rope.freq_base and the scaling.
                let window = opt_u("attention.sliding_window")?.unwrap_or(4096);
                let layers = (0..n_layer)
                    .map(|i| {
                        if i % 6 == 5 {
                            LayerSpec {
                                window: None,
                                rope: rope(freq_base, freq_scale, RopeStyle::Neox),
                            }
                        } else {
                            LayerSpec {
                                window: Some(window),
                                rope: rope(10_000.0, 1.0, RopeStyle::Neox),
                            }
                        }
                    })
                    .collect();
                // Gemma 3 27B scales queries by 1/sqrt(d_model / n_head) rather than by the head dim.
                let scale_dim = if n_layer == 62 { d_model / n_head } else { head_dim };
                let embed_scale = Some((d_model as f32).sqrt());
                (
                    layers,
                    1.0 / (scale_dim as f32).sqrt(),
                    embed_scale,
                    Activation::GeluTanh,
                    true,
                    true,
                )
            }
            Arch::Qwen3 | Arch::Qwen3Moe => {
                let spec = LayerSpec {
                    window: None,
                    rope: rope(freq_base, freq_scale, RopeStyle::Neox),
                };
                (
                    vec![spec; n_layer],
                    1.0 / (head_dim as f32).sqrt(),
                    None,
                    Activation::Silu,
                    true,
                    false,
                )
            }
        };
        Ok(ModelConfig {
            arch,
            n_vocab,
            d_model,
            n_head,
            n_kv_head,
            head_dim,
            d_ff,
            eps,
            context_length,
            layers,
            attn_scale,
            embed_scale,
            activation,
            qk_norm,
            post_norms,
            moe,
        })
    }
}

/// The expert block's metadata (`{arch}.expert_count`, `.expert_used_count`,
/// `.expert_feed_forward_length`, optional `.expert_weights_norm`, which Qwen3-MoE defaults to on).
fn moe_config(file: &GgufFile, arch_name: &str) -> Result<MoeConfig, ModelError> {
    let key = |k: &str| format!("{arch_name}.{k}");
    let req = |k: &str| -> Result<usize, ModelError> {
        let name = key(k);
        Ok(file.require(&name, file.get_u64(&name))? as usize)
    };
    let n_expert = req("expert_count")?;
    let n_expert_used = req("expert_used_count")?;
    let d_ff_expert = req("expert_feed_forward_length")?;
    if n_expert_used == 0 || n_expert_used > n_expert || d_ff_expert == 0 {
        return Err(ModelError::Config(format!(
            "{n_expert_used} of {n_expert} experts used, expert width {d_ff_expert}"
        )));
    }
    let norm_weights = file.get_bool(&key("expert_weights_norm"))?.unwrap_or(true);
    Ok(MoeConfig {
        n_expert,
        n_expert_used,
        d_ff_expert,
        norm_weights,
    })
}
