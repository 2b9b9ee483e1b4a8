//! Architecture shapes for synthetic models: the dimensions of real models, so that random weights time
//! the same as trained ones.

use anyhow::{bail, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Gemma3,
    Qwen3,
    Qwen3Moe,
}

impl Arch {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "llama" => Ok(Arch::Llama),
            "gemma3" => Ok(Arch::Gemma3),
            "qwen3" => Ok(Arch::Qwen3),
            "qwen3moe" => Ok(Arch::Qwen3Moe),
            _ => bail!("unknown architecture {s:?} (llama, gemma3, qwen3, qwen3moe)"),
        }
    }

    pub fn gguf_name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Gemma3 => "gemma3",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3moe",
        }
    }

    /// Per-head RMS norms of q and k before RoPE.
    pub fn qk_norm(self) -> bool {
        matches!(self, Arch::Gemma3 | Arch::Qwen3 | Arch::Qwen3Moe)
    }
}

#[derive(Clone, Debug)]
pub struct Shape {
    pub name: &'static str,
    pub arch: Arch,
    pub n_vocab: u64,
    pub d_model: u64,
    pub n_layer: u64,
    pub n_head: u64,
    pub n_kv_head: u64,
    pub head_dim: u64,
    pub d_ff: u64,
    pub context: u64,
    pub rope_base: f32,
    pub eps: f32,
    /// Output projection shares the token embedding (no `output.weight`).
    pub tied_output: bool,
    /// Gemma 3: sliding-window size of the local layers.
    pub sliding_window: u64,
    /// Gemma 3 27B: linear RoPE scaling of the global layers.
    pub rope_scaling_factor: Option<f32>,
    /// Qwen3-MoE: experts a layer, experts a row reads, and one expert's hidden width.
    pub n_expert: u64,
    pub n_expert_used: u64,
    pub d_ff_expert: u64,
}

const fn llama(name: &'static str) -> Shape {
    Shape {
        name,
        arch: Arch::Llama,
        n_vocab: 0,
        d_model: 0,
        n_layer: 0,
        n_head: 0,
        n_kv_head: 0,
        head_dim: 0,
        d_ff: 0,
        context: 0,
        rope_base: 10_000.0,
        eps: 1e-5,
        tied_output: false,
        sliding_window: 0,
        rope_scaling_factor: None,
        n_expert: 0,
        n_expert_used: 0,
        d_ff_expert: 0,
    }
}

/// Qwen3-30B-A3B's shape with `n_layer` layers: 128 experts of 768, 8 a row, 32/4 heads of 128.
const fn qwen3_30b_a3b(name: &'static str, n_layer: u64) -> Shape {
    Shape {
        arch: Arch::Qwen3Moe,
        n_vocab: 151_936,
        d_model: 2048,
        n_layer,
        n_head: 32,
        n_kv_head: 4,
        head_dim: 128,
        d_ff: 6144,
        context: 40_960,
        rope_base: 1_000_000.0,
        eps: 1e-6,
        n_expert: 128,
        n_expert_used: 8,
        d_ff_expert: 768,
        ..llama(name)
    }
}

pub const SHAPES: &[Shape] = &[
    Shape {
        n_vocab: 512,
        d_model: 64,
        n_layer: 2,
        n_head: 4,
        n_kv_head: 2,
        head_dim: 16,
        d_ff: 128,
        context: 512,
        ..llama("tiny")
    },
    Shape {
        n_vocab: 49152,
        d_model: 576,
        n_layer: 30,
        n_head: 9,
        n_kv_head: 3,
        head_dim: 64,
        d_ff: 1536,
        context: 8192,
        rope_base: 100_000.0,
        tied_output: true,
        ..llama("smollm2-135m")
    },
    Shape {
        n_vocab: 128256,
        d_model: 4096,
        n_layer: 32,
        n_head: 32,
        n_kv_head: 8,
        head_dim: 128,
        d_ff: 14336,
        context: 8192,
        rope_base: 500_000.0,
        ..llama("llama3-8b")
    },
    Shape {
        arch: Arch::Gemma3,
        n_vocab: 512,
        d_model: 64,
        n_layer: 7,
        n_head: 4,
        n_kv_head: 2,
        head_dim: 32,
        d_ff: 128,
        context: 512,
        rope_base: 1_000_000.0,
        eps: 1e-6,
        tied_output: true,
        sliding_window: 8,
        ..llama("tiny")
    },
    Shape {
        arch: Arch::Gemma3,
        n_vocab: 262144,
        d_model: 640,
        n_layer: 18,
        n_head: 4,
        n_kv_head: 1,
        head_dim: 256,
        d_ff: 2048,
        context: 32768,
        rope_base: 1_000_000.0,
        eps: 1e-6,
        tied_output: true,
        sliding_window: 512,
        ..llama("gemma3-270m")
    },
    Shape {
        arch: Arch::Gemma3,
        n_vocab: 262208,
        d_model: 5376,
        n_layer: 62,
        n_head: 32,
        n_kv_head: 16,
        head_dim: 128,
        d_ff: 21504,
        context: 131072,
        rope_base: 1_000_000.0,
        eps: 1e-6,
        tied_output: true,
        sliding_window: 1024,
        rope_scaling_factor: Some(8.0),
        ..llama("gemma3-27b")
    },
    Shape {
        arch: Arch::Qwen3,
        n_vocab: 512,
        d_model: 256,
        n_layer: 2,
        n_head: 4,
        n_kv_head: 2,
        head_dim: 64,
        d_ff: 512,
        context: 512,
        rope_base: 1_000_000.0,
        eps: 1e-6,
        // Tied, so the layers write into the residual stream at full scale and drive the logits
        // (an untied synthetic output mostly reads the embedding back): the parity test checks them.
        tied_output: true,
        ..llama("tiny")
    },
    Shape {
        arch: Arch::Qwen3,
        n_vocab: 151_936,
        d_model: 1024,
        n_layer: 28,
        n_head: 16,
        n_kv_head: 8,
        head_dim: 128,
        d_ff: 3072,
        context: 40_960,
        rope_base: 1_000_000.0,
        eps: 1e-6,
        tied_output: true,
        ..llama("qwen3-0.6b")
    },
    Shape {
        arch: Arch::Qwen3Moe,
        n_vocab: 512,
        d_model: 256,
        n_layer: 2,
        n_head: 4,
        n_kv_head: 2,
        head_dim: 64,
        d_ff: 512,
        context: 512,
        rope_base: 1_000_000.0,
        eps: 1e-6,
        // Tied, so the layers write into the residual stream at full scale and drive the logits
        // (an untied synthetic output mostly reads the embedding back): the parity test checks them.
        tied_output: true,
        n_expert: 16,
        n_expert_used: 4,
        d_ff_expert: 256,
        ..llama("qwen3-moe-tiny")
    },
    qwen3_30b_a3b("qwen3-30b-a3b", 48),
    qwen3_30b_a3b("qwen3-30b-a3b-16l", 16),
    qwen3_30b_a3b("qwen3-30b-a3b-4l", 4),
];

pub fn find(arch: Arch, name: &str) -> Result<&'static Shape> {
    SHAPES.iter().find(|s| s.arch == arch && s.name == name).ok_or_else(|| {
        let known: Vec<_> = SHAPES.iter().filter(|s| s.arch == arch).map(|s| s.name).collect();
        anyhow::anyhow!(
            "no shape {name:?} for {} (known: {})",
            arch.gguf_name(),
            known.join(", ")
        )
    })
}

/// What a tensor is for, which decides its type in a quantization mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Embedding,
    Output,
    Norm,
    AttnQ,
    AttnK,
    AttnV,
    AttnOutput,
    FfnGate,
    FfnUp,
    FfnDown,
    /// A mixture's router (`ffn_gate_inp`), which llama.cpp keeps in f32.
    Router,
}

pub struct TensorSpec {
    pub name: String,
    /// ggml order: row length first.
    pub dims: Vec<u64>,
    pub role: Role,
    pub layer: Option<u64>,
}

impl Shape {
    /// Every tensor of the model, in the order llama.cpp's converters write them.
    pub fn tensors(&self) -> Vec<TensorSpec> {
        let d = self.d_model;
        let q = self.n_head * self.head_dim;
        let kv = self.n_kv_head * self.head_dim;
        let t = |name: String, dims: Vec<u64>, role, layer| TensorSpec {
            name,
            dims,
            role,
            layer,
        };
        let mut out = vec![t(
            "token_embd.weight".into(),
            vec![d, self.n_vocab],
            Role::Embedding,
            None,
        )];
        for i in 0..self.n_layer {
            let b = |s: &str| format!("blk.{i}.{s}.weight");
            let l = Some(i);
            out.push(t(b("attn_norm"), vec![d], Role::Norm, l));
            out.push(t(b("attn_q"), vec![d, q], Role::AttnQ, l));
            out.push(t(b("attn_k"), vec![d, kv], Role::AttnK, l));
            out.push(t(b("attn_v"), vec![d, kv], Role::AttnV, l));
            out.push(t(b("attn_output"), vec![q, d], Role::AttnOutput, l));
            if self.arch.qk_norm() {
                out.push(t(b("attn_q_norm"), vec![self.head_dim], Role::Norm, l));
                out.push(t(b("attn_k_norm"), vec![self.head_dim], Role::Norm, l));
            }
            if self.arch == Arch::Gemma3 {
                out.push(t(b("post_attention_norm"), vec![d], Role::Norm, l));
                out.push(t(b("post_ffw_norm"), vec![d], Role::Norm, l));
            }
            out.push(t(b("ffn_norm"), vec![d], Role::Norm, l));
            if self.arch == Arch::Qwen3Moe {
                let (n, f) = (self.n_expert, self.d_ff_expert);
                out.push(t(b("ffn_gate_inp"), vec![d, n], Role::Router, l));
                out.push(t(b("ffn_gate_exps"), vec![d, f, n], Role::FfnGate, l));
                out.push(t(b("ffn_up_exps"), vec![d, f, n], Role::FfnUp, l));
                out.push(t(b("ffn_down_exps"), vec![f, d, n], Role::FfnDown, l));
            } else {
                out.push(t(b("ffn_gate"), vec![d, self.d_ff], Role::FfnGate, l));
                out.push(t(b("ffn_up"), vec![d, self.d_ff], Role::FfnUp, l));
                out.push(t(b("ffn_down"), vec![self.d_ff, d], Role::FfnDown, l));
            }
        }
        out.push(t("output_norm.weight".into(), vec![d], Role::Norm, None));
        if !self.tied_output {
            out.push(t("output.weight".into(), vec![d, self.n_vocab], Role::Output, None));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_are_consistent() {
        for s in SHAPES {
            assert_eq!(s.d_model % 32, 0, "{}", s.name);
            assert_eq!(s.d_ff % 32, 0, "{}", s.name);
            assert!(s.n_head % s.n_kv_head == 0, "{}", s.name);
            assert_eq!(s.arch == Arch::Gemma3, s.sliding_window > 0, "{}", s.name);
            assert_eq!(s.arch == Arch::Qwen3Moe, s.n_expert > 0, "{}", s.name);
            assert!(s.n_expert_used <= s.n_expert && s.d_ff_expert % 32 == 0, "{}", s.name);
            let names: Vec<_> = s.tensors().into_iter().map(|t| t.name).collect();
            let mut dedup = names.clone();
            dedup.sort();
            dedup.dedup();
            assert_eq!(dedup.len(), names.len(), "{}", s.name);
        }
        assert!(find(Arch::Llama, "gemma3-270m").is_err());
        assert_eq!(find(Arch::Gemma3, "gemma3-270m").unwrap().tensors().len(), 236);
        // Qwen3-30B-A3B as its GGUF files list it: 3 + 48 × 12 tensors.
        assert_eq!(find(Arch::Qwen3Moe, "qwen3-30b-a3b").unwrap().tensors().len(), 579);
    }
}
