//! The model's tensors: matrices stay in the memory-mapped file (zero-copy), small vectors (norms) are
//! read into f32. Every tensor's presence, type and shape is checked at load, with errors naming it.

use tandem_gguf::{GgmlType, GgufFile, TensorInfo};

use crate::config::ModelConfig;
use crate::ModelError;

/// A weight matrix inside the file: `rows` rows of `cols` elements (ggml dims `[cols, rows]`).
#[derive(Clone, Debug)]
pub struct Matrix {
    pub name: String,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    offset: usize,
    len: usize,
}

impl Matrix {
    pub fn bytes<'f>(&self, file: &'f GgufFile) -> &'f [u8] {
        &file.bytes()[self.offset..self.offset + self.len]
    }

    pub fn row_bytes(&self) -> usize {
        self.len / self.rows.max(1)
    }
}

/// A norm's weight vector, read into f32, with the tensor name backends key their copies by.
#[derive(Clone, Debug)]
pub struct Norm {
    pub name: String,
    pub data: Vec<f32>,
}

impl std::ops::Deref for Norm {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.data
    }
}

pub struct LayerWeights {
    pub attn_norm: Norm,
    pub wq: Matrix,
    pub wk: Matrix,
    pub wv: Matrix,
    pub wo: Matrix,
    pub q_norm: Option<Norm>,
    pub k_norm: Option<Norm>,
    pub post_attn_norm: Option<Norm>,
    pub ffn_norm: Norm,
    pub gate: Matrix,
    pub up: Matrix,
    pub down: Matrix,
    pub post_ffn_norm: Option<Norm>,
}

impl LayerWeights {
    /// The attention block's projections of its pre-normed input, in the graph's order.
    pub fn qkv(&self) -> [&Matrix; 3] {
        [&self.wq, &self.wk, &self.wv]
    }

    /// The feed-forward block's projections of its pre-normed input, in the graph's order.
    pub fn gate_up(&self) -> [&Matrix; 2] {
        [&self.gate, &self.up]
    }
}

pub struct Weights {
    pub token_embd: Matrix,
    /// The output projection; the token embedding itself when the model ties them.
    pub output: Matrix,
    pub output_norm: Norm,
    pub layers: Vec<LayerWeights>,
}

fn info<'f>(file: &'f GgufFile, name: &str) -> Result<&'f TensorInfo, ModelError> {
    file.tensor_info(name).ok_or_else(|| ModelError::Tensor {
        name: name.into(),
        reason: "missing".into(),
    })
}

fn matrix(file: &GgufFile, name: &str, cols: usize, rows: usize) -> Result<Matrix, ModelError> {
    let t = info(file, name)?;
    if t.dims != [cols as u64, rows as u64] {
        return Err(ModelError::Tensor {
            name: name.into(),
            reason: format!("shape {:?}, expected [{cols}, {rows}]", t.dims),
        });
    }
    if tandem_backend::WeightClass::of(t.ty).is_none() {
        return Err(ModelError::Tensor {
            name: name.into(),
            reason: format!("type {} has no CPU kernel", t.ty),
        });
    }
    Ok(Matrix {
        name: name.into(),
        ty: t.ty,
        rows,
        cols,
        offset: (file.data_offset + t.offset) as usize,
        len: t.size as usize,
    })
}

fn vector(file: &GgufFile, name: &str, len: usize) -> Result<Norm, ModelError> {
    let t = info(file, name)?;
    if t.dims != [len as u64] {
        return Err(ModelError::Tensor {
            name: name.into(),
            reason: format!("shape {:?}, expected [{len}]", t.dims),
        });
    }
    let data = tandem_quant::dequantize(t.ty, file.tensor_data(t)).map_err(|e| ModelError::Tensor {
        name: name.into(),
        reason: e.to_string(),
    })?;
    Ok(Norm {
        name: name.into(),
        data,
    })
}

fn optional_vector(file: &GgufFile, name: &str, len: usize, wanted: bool) -> Result<Option<Norm>, ModelError> {
    if wanted {
        vector(file, name, len).map(Some)
    } else {
        Ok(None)
    }
}

impl Weights {
    pub fn load(file: &GgufFile, c: &ModelConfig) -> Result<Self, ModelError> {
        let d = c.d_model;
        let token_embd = matrix(file, "token_embd.weight", d, c.n_vocab)?;
        let output = match file.tensor_info("output.weight") {
            Some(_) => matrix(file, "output.weight", d, c.n_vocab)?,
            None => token_embd.clone(),
        };
        let output_norm = vector(file, "output_norm.weight", d)?;
        let mut layers = Vec::with_capacity(c.n_layer());
        for i in 0..c.n_layer() {
            let n = |s: &str| format!("blk.{i}.{s}.weight");
            layers.push(LayerWeights {
                attn_norm: vector(file, &n("attn_norm"), d)?,
                wq: matrix(file, &n("attn_q"), d, c.q_width())?,
                wk: matrix(file, &n("attn_k"), d, c.kv_width())?,
                wv: matrix(file, &n("attn_v"), d, c.kv_width())?,
                wo: matrix(file, &n("attn_output"), c.q_width(), d)?,
                q_norm: optional_vector(file, &n("attn_q_norm"), c.head_dim, c.qk_norm)?,
                k_norm: optional_vector(file, &n("attn_k_norm"), c.head_dim, c.qk_norm)?,
                post_attn_norm: optional_vector(file, &n("post_attention_norm"), d, c.post_norms)?,
                ffn_norm: vector(file, &n("ffn_norm"), d)?,
                gate: matrix(file, &n("ffn_gate"), d, c.d_ff)?,
                up: matrix(file, &n("ffn_up"), d, c.d_ff)?,
                down: matrix(file, &n("ffn_down"), c.d_ff, d)?,
                post_ffn_norm: optional_vector(file, &n("post_ffw_norm"), d, c.post_norms)?,
            });
        }
        Ok(Weights {
            token_embd,
            output,
            output_norm,
            layers,
        })
    }

    /// Every weight matrix, each once (a tied output is the embedding table).
    pub fn matrices(&self) -> Vec<&Matrix> {
        let mut all = vec![&self.token_embd];
        if self.output.name != self.token_embd.name {
            all.push(&self.output);
        }
        for l in &self.layers {
            all.extend([&l.wq, &l.wk, &l.wv, &l.wo, &l.gate, &l.up, &l.down]);
        }
        all
    }

    /// Matrices that multiply the same input, in the order the graph applies them (per layer: q, k
    /// and v; gate and up): a backend may run each group as one launch.
    pub fn input_groups(&self) -> Vec<Vec<&Matrix>> {
        let mut all = Vec::with_capacity(2 * self.layers.len());
        for l in &self.layers {
            all.push(l.qkv().to_vec());
            all.push(l.gate_up().to_vec());
        }
        all
    }

    /// Every norm vector.
    pub fn norms(&self) -> Vec<&Norm> {
        let mut all = vec![&self.output_norm];
        for l in &self.layers {
            all.extend([&l.attn_norm, &l.ffn_norm]);
            all.extend(
                [&l.q_norm, &l.k_norm, &l.post_attn_norm, &l.post_ffn_norm]
                    .into_iter()
                    .flatten(),
            );
        }
        all
    }

    /// Bytes of weights one decode step streams: every layer matrix and the output projection.
    pub fn decode_bytes(&self) -> usize {
        let layer: usize = self
            .layers
            .iter()
            .map(|l| {
                [&l.wq, &l.wk, &l.wv, &l.wo, &l.gate, &l.up, &l.down]
                    .iter()
                    .map(|m| m.len)
                    .sum::<usize>()
            })
            .sum();
        layer + self.output.len
    }
}
