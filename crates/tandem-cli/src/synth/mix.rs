//! Quantization mixes: which type each tensor gets, following llama.cpp's choices for its named mixes
//! (e.g. Q4_K_M keeps the output and some attn_v / ffn_down layers in Q6_K), including its fallback to a
//! 32-element type when a row is not a whole number of 256-element K-quant blocks.

use anyhow::{bail, Result};
use tandem_gguf::GgmlType;

use super::shapes::Role;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantMix {
    /// Every matrix in one type.
    Uniform(GgmlType),
    Q4KM,
    Q5KM,
}

impl QuantMix {
    pub fn parse(s: &str) -> Result<Self> {
        let lower = s.to_ascii_lowercase();
        match lower.as_str() {
            "q4_k_m" => return Ok(QuantMix::Q4KM),
            "q5_k_m" => return Ok(QuantMix::Q5KM),
            _ => {}
        }
        match GgmlType::from_name(&lower) {
            Some(t) if tandem_quant::is_supported(t) && t != GgmlType::Q8_K => Ok(QuantMix::Uniform(t)),
            _ => bail!(
                "unknown quantization mix {s:?} (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, \
                 q5_k, q6_k, q4_k_m, q5_k_m)"
            ),
        }
    }

    pub fn name(self) -> String {
        match self {
            QuantMix::Uniform(t) => t.name().to_ascii_lowercase(),
            QuantMix::Q4KM => "q4_k_m".into(),
            QuantMix::Q5KM => "q5_k_m".into(),
        }
    }

    /// llama.cpp's `general.file_type` (llama_ftype) for the mix.
    pub fn file_type(self) -> u32 {
        use GgmlType::*;
        match self {
            QuantMix::Q4KM => 15,
            QuantMix::Q5KM => 17,
            QuantMix::Uniform(t) => match t {
                F32 => 0,
                F16 => 1,
                Q4_0 => 2,
                Q4_1 => 3,
                Q8_0 => 7,
                Q5_0 => 8,
                Q5_1 => 9,
                Q2_K => 10,
                Q3_K => 11,
                Q4_K => 14,
                Q5_K => 16,
                Q6_K => 18,
                BF16 => 32,
                _ => 0,
            },
        }
    }

    /// The type of one tensor. `row_len` is its first dimension.
    pub fn type_for(self, role: Role, layer: Option<u64>, n_layer: u64, row_len: u64) -> GgmlType {
        if matches!(role, Role::Norm | Role::Router) {
            return GgmlType::F32;
        }
        let chosen = match self {
            QuantMix::Uniform(t) => t,
            QuantMix::Q4KM | QuantMix::Q5KM => {
                let base = if self == QuantMix::Q4KM {
                    GgmlType::Q4_K
                } else {
                    GgmlType::Q5_K
                };
                let more_bits = layer.is_some_and(|i| use_more_bits(i, n_layer));
                match role {
                    Role::Output => GgmlType::Q6_K,
                    Role::AttnV | Role::FfnDown if more_bits => GgmlType::Q6_K,
                    _ => base,
                }
            }
        };
        if row_len.is_multiple_of(chosen.block_elems() as u64) {
            chosen
        } else {
            fallback(chosen)
        }
    }
}

/// llama.cpp's rule for the layers of a "_M" mix that get more bits: the first and last eighth, and every
/// third layer in between.
fn use_more_bits(layer: u64, n_layer: u64) -> bool {
    let eighth = n_layer / 8;
    layer < eighth || layer >= 7 * n_layer / 8 || (layer - eighth) % 3 == 2
}

/// A 32-element type for rows that K-quants cannot tile.
fn fallback(t: GgmlType) -> GgmlType {
    use GgmlType::*;
    match t {
        Q2_K | Q3_K => Q4_0,
        Q4_K => Q5_0,
        Q5_K => Q5_1,
        Q6_K => Q8_0,
        _ => F16,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_k_m_matches_llama_cpp_on_gemma3_270m() {
        // The real gemma-3-270m-q4_k_m.gguf: 640-wide rows fall back (Q4_K → Q5_0, Q6_K → Q8_0), while
        // attn_output (1024-wide rows) stays Q4_K and ffn_down (2048) gets Q6_K.
        let m = QuantMix::Q4KM;
        assert_eq!(m.type_for(Role::AttnQ, Some(0), 18, 640), GgmlType::Q5_0);
        assert_eq!(m.type_for(Role::AttnV, Some(0), 18, 640), GgmlType::Q8_0);
        assert_eq!(m.type_for(Role::AttnOutput, Some(0), 18, 1024), GgmlType::Q4_K);
        assert_eq!(m.type_for(Role::FfnDown, Some(0), 18, 2048), GgmlType::Q6_K);
        assert_eq!(m.type_for(Role::Norm, Some(0), 18, 640), GgmlType::F32);
        assert_eq!(m.type_for(Role::Output, None, 32, 4096), GgmlType::Q6_K);
    }

    #[test]
    fn mixes_parse() {
        assert_eq!(QuantMix::parse("Q8_0").unwrap(), QuantMix::Uniform(GgmlType::Q8_0));
        assert_eq!(QuantMix::parse("q4_k_m").unwrap(), QuantMix::Q4KM);
        assert!(QuantMix::parse("iq2_xxs").is_err());
        assert!(QuantMix::parse("nonsense").is_err());
    }
}
